#!/usr/bin/env bash
# The main job: install, build, check every op against its reference (errors and speed-ups),
# train the tiny K3-style model on the built-in text (WordNet + GCIDE read at run time) through
# two short context stages (loss, held-out loss, expert load; report in runs/tiny-cpu), size the
# K3 flagship, then benchmark GEMM against raw oneDNN and element-wise bandwidth against memcpy.
# Chat and serving arrive with the inference issue; the full 4-stage curriculum with its evals
# with the pretraining issue.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
cmake --preset release >/dev/null
cmake --build --preset release -j "${MYRIAD_JOBS:-2}"
# Passive OpenMP waiting for the many small ops of the self-check and of tiny-model training:
# spinning workers collapse when the machine has other load. The benchmarks keep the default.
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} build/release/myriad selfcheck
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} build/release/myriad train configs/recipes/tiny-cpu.toml \
  --out "runs/tiny-cpu-$(date +%Y%m%d-%H%M%S)"
echo "run report: runs/tiny-cpu-*/report.html (TensorBoard event files alongside)"
build/release/bench_gemm
build/release/bench_elementwise
# The planned flagship and the CPU test size, as the engine builds them (parameters, caches).
build/release/myriad inspect configs/kimi-k3 | grep -v '^  [0-9]*: '
build/release/myriad inspect configs/tiny | grep -v '^  [0-9]*: '
