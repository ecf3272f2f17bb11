#!/usr/bin/env bash
# The main job. Until the training pipeline lands this is the engine's end-to-end self-check:
# install, build, check every op against its reference (printing errors and speed-ups), then
# benchmark GEMM against raw oneDNN and element-wise bandwidth against memcpy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
cmake --preset release >/dev/null
cmake --build --preset release -j "${MYRIAD_JOBS:-2}"
build/release/myriad selfcheck
build/release/bench_gemm
build/release/bench_elementwise
# The planned flagship and the CPU test size, as the engine builds them (parameters, caches).
build/release/myriad inspect configs/kimi-k3 | grep -v '^  [0-9]*: '
build/release/myriad inspect configs/tiny | grep -v '^  [0-9]*: '
