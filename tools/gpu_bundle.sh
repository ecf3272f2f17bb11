#!/usr/bin/env bash
# Packs prebuilt GPU test binaries for a machine that has a GPU but not Myriad's build
# dependencies (oneDNN, GoogleTest, sentencepiece, ...): the test programs and benchmarks of a
# CUDA-enabled build plus every shared library they load that is neither the C/C++ runtime nor a
# CUDA library (those come from the GPU machine's CUDA install). tools/gpu_check.sh runs the
# bundle when MYRIAD_GPU_PREBUILT names its folder.
#
#   tools/gpu_bundle.sh [build-dir] [out-dir]     (defaults: build/release, .gpu)
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build/release}
out=${2:-.gpu}
grep -q -- "-DMYRIAD_HAVE_CUDA=1" "$build/build.ninja" 2>/dev/null || {
  echo "gpu_bundle: $build is not a CUDA-enabled build" >&2
  exit 1
}
progs=(test_ops test_model bench_cuda_gemm bench_cuda_model)
rm -rf "$out/bundle" && mkdir -p "$out/bundle/bin" "$out/bundle/lib"
for p in "${progs[@]}"; do
  [ -x "$build/$p" ] || continue
  strip -o "$out/bundle/bin/$p" "$build/$p"
  # Shared libraries outside glibc, the C++ runtime and CUDA.
  ldd "$build/$p" | awk '/=> \// {print $3}' |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl|librt|libcuda|libcublas|libcublasLt|libcudart|libnccl)[.-]' |
    while read -r lib; do cp -Ln "$lib" "$out/bundle/lib/" 2>/dev/null || true; done
done
echo "$PWD" >"$out/bundle/source_dir"
echo "$(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)" >"$out/bundle/commit"
tar -C "$out" -czf "$out/bundle.tgz" bundle
rm -rf "$out/bundle"
ls -la "$out/bundle.tgz"
