#!/usr/bin/env bash
# Fresh-machine check: a minimal Debian 12 root (debootstrap --variant=minbase bookworm, cached as
# a tarball), the committed project cloned into it, then the README's own steps run there. A used
# development machine hides install steps that only it has; this root has nothing but minbase.
#
# Usage (as root): scripts/clean-room.sh [configure|build|main|test]
#   configure  scripts/install-deps.sh + cmake --preset release            (.ci/run, every time)
#   build      configure + build the myriad binary + myriad selfcheck      (before resolving
#              anything that touches dependencies: install-deps.sh, CMakeLists.txt, cmake/)
#   main       the README's first command, scripts/main.sh, whole
#   test       the README's second command, scripts/test.sh, whole
# The root is new every time (unpacked from the tarball) and removed afterwards. Build modes bind
# the host's ccache folder into the root (MYRIAD_CLEAN_ROOT_CCACHE=0: don't): ccache only replays
# a compile whose preprocessed inputs all exist in the root, so it cannot hide a missing header,
# and linking always runs. Log: $MYRIAD_CLEAN_ROOT_LOG (default /tmp/myriad-clean-room-<mode>.log);
# MYRIAD_CLEAN_ROOT_KEEP=DIR copies the runs/ the steps wrote (the main job's run) out to DIR.
set -euo pipefail
mode=${1:-configure}
case $mode in configure | build | main | test) ;; *)
  echo "usage: $0 [configure|build|main|test]" >&2
  exit 2
  ;;
esac
[ "$(id -u)" -eq 0 ] || {
  echo "clean-room: needs root (debootstrap, chroot, bind mounts)" >&2
  exit 2
}
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
cache=${MYRIAD_CLEAN_ROOT_CACHE:-/var/cache/myriad-clean-room}
tarball=$cache/bookworm-minbase.tar
log=${MYRIAD_CLEAN_ROOT_LOG:-/tmp/myriad-clean-room-$mode.log}
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0)) s"; }

if [ ! -f "$tarball" ]; then
  command -v debootstrap >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1
  mkdir -p "$cache"
  fresh=$(mktemp -d /tmp/myriad-debootstrap.XXXXXX)
  echo "clean-room: debootstrap minbase bookworm from $mirror (cached in $tarball)"
  debootstrap --variant=minbase bookworm "$fresh" "$mirror" >"$log.debootstrap" 2>&1 || {
    echo "clean-room: debootstrap failed (see $log.debootstrap)" >&2
    rm -rf --one-file-system "$fresh"
    exit 2
  }
  tar -C "$fresh" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
  rm -rf --one-file-system "$fresh"
fi

root=$(mktemp -d /tmp/myriad-clean-room.XXXXXX)
mounts=()
cleanup() {
  local m p ok=1
  # Processes still running inside the root (the script was interrupted) go first.
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  sleep 0.5
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
  for m in "${mounts[@]}"; do mountpoint -q "$m" && ok=0; done
  # Never delete through a bind mount that is still there (it would reach the host's /dev).
  if ((ok)); then rm -rf --one-file-system "$root"; else echo "clean-room: left $root (busy)" >&2; fi
}
trap cleanup EXIT
tar -C "$root" -xf "$tarball"
cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
rm -f "$root/etc/apt/sources.list"
cp /etc/resolv.conf "$root/etc/resolv.conf"
bind() {
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
}
for m in proc dev sys; do bind "/$m" "$root/$m"; done
env=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
  TERM=dumb MYRIAD_JOBS="${MYRIAD_JOBS:-2}")
if [ "$mode" != configure ] && [ "${MYRIAD_CLEAN_ROOT_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  host_ccache=$(ccache -k cache_dir)
  mkdir -p "$host_ccache"
  bind "$host_ccache" "$root/ccache"
  env+=(CCACHE_DIR=/ccache)
fi
# This sandbox reaches PyPI through the host's certificate bundle (the test command's Python
# checks install openai and tensorboard); a real new machine has its own.
if [ "$mode" = test ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$root/etc/myriad-host-certs"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/myriad-host-certs/"
  env+=(PIP_CERT=/etc/myriad-host-certs/ca-certificates.crt)
fi
git clone -q "$repo" "$root/src/myriad"

case $mode in
  configure) steps='bash scripts/install-deps.sh && cmake --preset release' ;;
  build)
    steps='bash scripts/install-deps.sh && cmake --preset release &&
      cmake --build --preset release -j "$MYRIAD_JOBS" --target myriad &&
      OMP_WAIT_POLICY=PASSIVE build/release/myriad selfcheck'
    ;;
  main) steps='scripts/main.sh' ;;
  test) steps='scripts/test.sh' ;;
esac
echo "clean-room: $mode in a fresh Debian 12 minbase root (log: $log)"
rc=0
chroot "$root" /usr/bin/env -i "${env[@]}" /bin/bash -c "cd /src/myriad && $steps" >"$log" 2>&1 || rc=$?
if [ -n "${MYRIAD_CLEAN_ROOT_KEEP:-}" ] && [ -d "$root/src/myriad/runs" ]; then
  mkdir -p "$MYRIAD_CLEAN_ROOT_KEEP" && cp -a "$root/src/myriad/runs/." "$MYRIAD_CLEAN_ROOT_KEEP/"
fi
if ((rc == 0)); then
  echo "clean-room: $mode ok in $(elapsed)"
else
  echo "clean-room: $mode failed (rc $rc) after $(elapsed); the log ends:"
  tail -n 25 "$log"
fi
exit $rc
