#!/usr/bin/env bash
# The test command: installs dependencies, builds the release preset (CUDA backend included when
# nvcc is present; its tests run when a GPU is visible and print as skipped otherwise), runs every
# test (with the official openai client against the server: chat, an agent's tool-call loop,
# images as PNG data URLs, and a model directory laid out as a published Kimi checkpoint),
# then rebuilds CPU-only with AddressSanitizer + UBSan and runs the tests again.
# Last, the fuzz targets for the untrusted-input parsers run for a bounded time
# (MYRIAD_FUZZ_SECONDS per target, default 30 here). MYRIAD_SKIP_ASAN=1 skips the sanitizer pass;
# a ThreadSanitizer build runs the engine and server tests (MYRIAD_SKIP_TSAN=1 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# Tests run two at a time on two cores: spinning OpenMP workers would fight each other.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
jobs=${MYRIAD_JOBS:-2}
t0=$(date +%s)
# Each part's header says how long the run has taken so far (CI stops a run at 90 minutes).
section() { echo "== $* ($(($(date +%s) - t0)) s in) =="; }

section "release build"
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

section "TensorBoard's own reader on Myriad's event files"
# check_tfevents.py installs the tensorboard package into tools/reference/.venv when needed.
MYRIAD_TB_CHECK_PYTHON=python3 build/release/test_train --gtest_filter='Events.*'

section "the official openai Python client against myriad serve"
# openai_client_check.py installs the openai package into tools/reference/.venv when needed.
MYRIAD_OPENAI_CHECK_PYTHON=python3 build/release/test_serve --gtest_filter='Server.OfficialOpenAIClient'

section "an agent through the openai client: tools, tool_calls, tool messages, scored by the RL evaluator"
# A briefly SFT-trained calculator model; the client's greedy episodes must equal the engine's.
scripts/check_agent_openai.sh

section "images through the openai client: PNG data URLs answered as the evaluator answers them"
# A briefly trained Fashion-MNIST model; bad images must be 400s and the server must keep serving.
scripts/check_vision_openai.sh

section "a model directory laid out as a published Kimi checkpoint, through the openai client"
# tiktoken.model, a Jinja template in tokenizer_config.json, FP8 weights, generation_config.json:
# prompt tokens equal transformers' rendering + tiktoken, tools, tool results, bad requests.
MYRIAD_BIN=build/release/myriad scripts/check_published_layout.sh

section "Myriad's K3 forward against llama.cpp (runs when scripts/peers/llama_cpp.sh has built it)"
MYRIAD=build/release/myriad tests/check_llama_cpp_k3.sh

section "planner memory prediction vs measured training peaks (within 15%)"
scripts/check_plan_memory.sh

if [ "${MYRIAD_SKIP_ASAN:-0}" != 1 ]; then
  section "AddressSanitizer + UBSan build"
  cmake --preset debug-asan >/dev/null
  cmake --build --preset debug-asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset debug-asan -j "$jobs"
fi

if [ "${MYRIAD_SKIP_TSAN:-0}" != 1 ]; then
  # The engine's, scheduler's and server's own threads; libgomp is not built for TSan, so OpenMP
  # is held to the calling thread (OMP_THREAD_LIMIT=1) and every thread checked is Myriad's.
  section "ThreadSanitizer: engine, scheduler and server tests"
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan -j "$jobs"
  for t in test_infer test_serve; do
    OMP_THREAD_LIMIT=1 OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      build/tsan/$t --gtest_brief=1
  done
fi

section "fuzz targets (${MYRIAD_FUZZ_SECONDS:-30} s each)"
MYRIAD_FUZZ_SECONDS=${MYRIAD_FUZZ_SECONDS:-30} scripts/fuzz.sh
section "all passed"
