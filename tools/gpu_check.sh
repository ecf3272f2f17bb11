#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU: every CUDA test (the /cuda instances of the op
# tests, the CudaBackend suite, the model on the device against the CPU model), then the
# benchmarks (bf16 GEMM; KDA, training and decode of the `medium` model), with one summary table.
# Two ways to get the programs:
#   - build here (the default): a release build with the CUDA backend (needs Myriad's build
#     dependencies: scripts/install-deps.sh);
#   - MYRIAD_GPU_PREBUILT=path/bundle.tgz: programs packed by tools/gpu_bundle.sh on a machine
#     with the dependencies (for a GPU machine that has CUDA but nothing else, and no network).
# The NCCL collectives run too when the build has the plugin and mpirun is present.
# Logs go to $OUT when set (the device runner's output folder), else to the build folder.
#
#   tools/gpu_check.sh                  MYRIAD_GPU_CHECK_ALL=1: every test, not only CUDA ones
#   MYRIAD_GPU_BENCH=0 tools/gpu_check.sh   skip the benchmarks
# Exit status: 0 when every test that ran passed and the benchmarks' own checks passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
build=${MYRIAD_GPU_BUILD:-build/gpu}
logs=${OUT:-$build}
jobs=${MYRIAD_JOBS:-$(nproc)}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
t0=$SECONDS
phase() { echo "== $* ($((SECONDS - t0)) s) =="; }

phase "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 ||
  echo "nvidia-smi unavailable"

if [ -n "${MYRIAD_GPU_PREBUILT:-}" ]; then
  phase "unpack $MYRIAD_GPU_PREBUILT"
  unpacked=/tmp/myriad-gpu
  rm -rf "$unpacked" && mkdir -p "$unpacked" && tar -C "$unpacked" -xzf "$MYRIAD_GPU_PREBUILT" ||
    exit 1
  bin=$unpacked/bundle/bin
  echo "bundle of commit $(cat "$unpacked/bundle/commit")"
  # CUDA's libraries from this machine's install (the bundle leaves them out).
  cudalib=$(ldconfig -p | awk '/libcublasLt\.so\.13/ {print $NF; exit}')
  [ -z "$cudalib" ] && cudalib=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
    2>/dev/null | head -1)
  [ -z "$cudalib" ] && { echo "no libcublasLt.so.13 on this machine"; exit 1; }
  export LD_LIBRARY_PATH=$unpacked/bundle/lib:$(dirname "$cudalib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # The tests find their fixtures through the source path compiled in: point it here.
  src=$(cat "$unpacked/bundle/source_dir")
  if [ "$src" != "$root" ] && [ ! -e "$src/tests/fixtures" ]; then
    mkdir -p "$(dirname "$src")" && ln -sfn "$root" "$src"
  fi
else
  phase "configure"
  flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DMYRIAD_CUDA=ON)
  targets=(test_ops test_model bench_cuda_gemm bench_cuda_model)
  if ! cmake -S . -B "$build" "${flags[@]}" -DMYRIAD_BENCH=ON >"$logs/configure.log" 2>&1; then
    tail -30 "$logs/configure.log"
    exit 1
  fi
  grep "CUDA backend" "$logs/configure.log"
  phase "build (${targets[*]}, -j $jobs)"
  if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$logs/build.log" 2>&1; then
    grep -E "error|FAILED" "$logs/build.log" | head -40
    exit 1
  fi
  bin=$build
fi

status=0
filter_ops='*/cuda:*Cuda*:*Device*'
filter_model='CudaModel.*'
if [ "${MYRIAD_GPU_CHECK_ALL:-0}" = 1 ]; then filter_ops='*'; filter_model='*'; fi
for t in "test_ops:$filter_ops" "test_model:$filter_model"; do
  prog=${t%%:*} filter=${t#*:}
  [ -x "$bin/$prog" ] || { echo "$prog missing"; status=1; continue; }
  phase "$prog --gtest_filter=$filter"
  OMP_NUM_THREADS=8 timeout "${MYRIAD_GPU_TEST_TIMEOUT:-900}" "$bin/$prog" --gtest_filter="$filter" \
    --gtest_output="xml:$logs/$prog.xml" >"$logs/$prog.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$logs/$prog.log" | head -4
done
# One table: per suite, passed / failed / skipped, then each failure's first message line.
python3 - "$logs" <<'PY' || status=1
import glob, re, sys, xml.etree.ElementTree as ET
rows, fails = {}, []
for f in sorted(glob.glob(sys.argv[1] + "/test_*.xml")):
    for case in ET.parse(f).getroot().iter("testcase"):
        suite = case.get("classname", "?")
        r = rows.setdefault(suite, [0, 0, 0])
        failure = case.find("failure")
        if case.find("skipped") is not None or case.get("result") == "skipped":
            r[2] += 1
        elif failure is not None:
            r[1] += 1
            msg = (failure.get("message") or "").strip().splitlines()
            fails.append(f"{suite}.{case.get('name')}: {msg[0][:200] if msg else ''}")
        else:
            r[0] += 1
print("| suite | passed | failed | skipped |\n|---|---|---|---|")
for s, (p, fl, sk) in rows.items():
    print(f"| {s} | {p} | {fl} | {sk} |")
tot = [sum(r[i] for r in rows.values()) for i in range(3)]
print(f"| total | {tot[0]} | {tot[1]} | {tot[2]} |")
for f in fails:
    print("FAILED", f)
sys.exit(1 if tot[1] else 0)
PY

if [ "${MYRIAD_GPU_BENCH:-1}" = 1 ]; then
  if [ -x "$bin/bench_cuda_gemm" ]; then
    phase "bench_cuda_gemm"
    timeout 120 "$bin/bench_cuda_gemm" 2>&1 | tee "$logs/bench_cuda_gemm.log" || status=1
  fi
  if [ -x "$bin/bench_cuda_model" ]; then
    # One process per part, each under its own limit (MYRIAD_GPU_PARTS="part:seconds ..."). The
    # train and decode parts first build the 688M random model on the host (30-40 s on an H200 host).
    for pt in ${MYRIAD_GPU_PARTS:-kda:60 train:180 decode:240}; do
      phase "bench_cuda_model parts=${pt%%:*}"
      timeout "${pt#*:}" "$bin/bench_cuda_model" config="$root/configs/medium" parts="${pt%%:*}" \
        ${MYRIAD_GPU_MODEL_ARGS:-} 2>&1 | tee -a "$logs/bench_cuda_model.log" || status=1
    done
  fi
fi

# NCCL: the communicator tests with every collective on NCCL, one rank per GPU (a build-here
# run only: the bundle carries no MPI).
if [ -z "${MYRIAD_GPU_PREBUILT:-}" ] && [ -f "$build/libmyriad_nccl.so" ] &&
  command -v mpirun >/dev/null; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
  [ "${gpus:-0}" -lt 1 ] && gpus=1
  phase "NCCL collectives, $gpus rank(s)"
  cmake --build "$build" -j "$jobs" --target test_dist >>"$logs/build.log" 2>&1 &&
    OMP_NUM_THREADS=2 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      MYRIAD_COMM=nccl timeout 300 mpirun --oversubscribe -np "$gpus" \
      -x OMP_NUM_THREADS -x MYRIAD_COMM "$build/test_dist" \
      --gtest_filter='Comm.*:ExpertParallel.*:DataParallel.BitwiseEqualToOneProcess' \
      >"$logs/nccl.log" 2>&1 || status=1
  grep -E "\[ Comm \] backend|PASSED|FAILED|SKIPPED \]" "$logs/nccl.log" | sort -u | head -10
fi

phase "done, status $status"
exit $status
