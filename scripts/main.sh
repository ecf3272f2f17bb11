#!/usr/bin/env bash
# The main job: install, build, check every op against its reference, train the tiny K3-style
# model (3:1 KDA:MLA, MoE with Quantile Balancing, SiTU, AttnRes) on the built-in text (WordNet +
# GCIDE read at run time) through the CPU context curriculum 256 -> 1K -> 4K -> 16K with its
# stage-end long-context evals, run the same model without balancing for contrast, post-train it
# (chat SFT on WordNet dictionary dialogues and calculator tool-use traces, then a few steps of
# agentic RL on the calculator task; held-out numbers before and after), then talk to it: a
# generation, and a chat request through the OpenAI-compatible server. Then a short multimodal run
# (the Fashion-MNIST image tower trained with a small decoder) answers a test image sent to the
# server as a PNG.
# Finally size the K3 flagship and benchmark GEMM and element-wise bandwidth.
# Everything lands in runs/tiny-curriculum-<time>/ (report.html, metrics.jsonl, TensorBoard
# events, checkpoints, model/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
cmake --preset release >/dev/null
cmake --build --preset release -j "${MYRIAD_JOBS:-2}"
# Passive OpenMP waiting for the many small ops of the self-check and of tiny-model training:
# spinning workers collapse when the machine has other load. The benchmarks keep the default.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
myriad=build/release/myriad
$myriad selfcheck
# Pretraining and chat SFT run data-parallel: `mpirun -np 2` ranks, each with all the threads
# (passive OpenMP waits; an idle rank yields in MPI), so the short stages split their
# micro-batches over the ranks and the 16K stage (one sequence per step) still has both cores.
# Losses and weights have the same bits as one process with as many threads (deterministic mode,
# docs/DISTRIBUTED.md). Step-time speed-ups over one process on 2 cores: 1.66x / 1.56x / 1.13x /
# 0.82x at 256 / 1K / 4K / 16K (docs/PERFORMANCE.md). MYRIAD_RANKS=1 trains in one process.
ranks=${MYRIAD_RANKS:-2}
command -v mpirun >/dev/null || ranks=1
train() {
  if [ "$ranks" -gt 1 ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 \
      mpirun -np "$ranks" --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
      -x OMPI_MCA_mpi_yield_when_idle $myriad train "$@"
  else
    $myriad train "$@"
  fi
}

run=runs/tiny-curriculum-$(date +%Y%m%d-%H%M%S)
start=$(date +%s)
train configs/recipes/tiny-curriculum.toml --out "$run"
train configs/recipes/tiny-curriculum-nobalancer.toml --out "$run/nobalancer" |
  grep -v '^\[' || true  # its summary, without the per-step lines
$myriad report "$run" --contrast "$run/nobalancer" --contrast-label "no balancing"
echo "training and evals took $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s"
echo "run report: $run/report.html (TensorBoard event files alongside)"

# Post-training: chat SFT from the pretrained model on dictionary dialogues, then RL on them (F1
# reward). Dictionary questions on training and held-out words before (the pretrained model,
# asked through the default chat template) and after.
post=$(date +%s)
for split in train heldout; do
  $myriad agent-eval "$run/model" --env dictionary --split $split --tasks 100 --k 1 \
    --json "$run/eval-dictionary-$split-base.json" | sed 's/^/before post-training: /'
done
train configs/recipes/tiny-posttrain-sft.toml --init "$run/model" --out "$run/sft" |
  grep -v '^\[' || true
$myriad rl configs/recipes/tiny-posttrain-rl.toml --init "$run/sft/model" --out "$run/rl" |
  grep -v '^\[rl\]' || true
for split in train heldout; do
  for m in sft rl; do
    label="after SFT"
    [ $m = rl ] && label="after SFT + RL"
    $myriad agent-eval "$run/$m/model" --env dictionary --split $split --tasks 100 --k 4 \
      --json "$run/eval-dictionary-$split-$m.json" | sed "s/^/$label: /"
  done
done
echo "post-training took $(( ($(date +%s) - post) / 60 )) min $(( ($(date +%s) - post) % 60 )) s"
echo "post-trained model: $run/rl/model (RL report: $run/rl/report.html)"

# Talk to it: one generation, then the OpenAI-compatible server with one chat request.
$myriad generate "$run/model" --prompt "The meaning of the word" --max-tokens 32 --temperature 0
port=${MYRIAD_PORT:-8765}
# serve MODEL LOG: starts the server in the background and waits until it answers.
serve() {
  $myriad serve "$1" --port "$port" >"$2" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.2
  done
}
serve "$run/rl/model" "$run/serve.log"
echo "POST /v1/chat/completions:"
curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "model", "messages": [{"role": "user", "content": "What does skit mean?"}],
       "max_tokens": 48, "temperature": 0}'
echo
kill -TERM $server && wait $server || true
trap - EXIT
echo "chat with it:  $myriad chat $run/rl/model"
echo "serve it:      $myriad serve $run/rl/model --port 8000   (OpenAI API at http://127.0.0.1:8000/v1)"

# Vision: a short multimodal run (Fashion-MNIST captions and 2×2 grid questions, a quarter of the
# rows text; docs/VISION.md has the full 15-minute run), its accuracy on test images, then one test
# image sent to the OpenAI-compatible server as a PNG data URL.
vis=$(date +%s)
$myriad train configs/recipes/vision/fashion-main.toml --out "$run/vision" | grep -v '^\[' || true
$myriad vision-eval "$run/vision/model" --images 1000 --grid 200 \
  --save-images "$run/vision/test-images" --save-count 4
echo "vision took $(( ($(date +%s) - vis) / 60 )) min $(( ($(date +%s) - vis) % 60 )) s"
serve "$run/vision/model" "$run/vision/serve.log"
image=$(ls "$run/vision/test-images"/test-0-*.png)
echo "POST /v1/chat/completions with $image (its class is in the file name):"
printf '{"model": "model", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user",
  "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%s"}},
              {"type": "text", "text": "What is this?"}]}]}' "$(base64 -w0 "$image")" |
  curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d @-
echo
kill -TERM $server && wait $server || true
trap - EXIT
echo "ask it about an image:  $myriad chat $run/vision/model   (then /image FILE)"

build/release/bench_gemm
build/release/bench_elementwise
# The planned flagship and the CPU test size, as the engine builds them (parameters, caches).
$myriad inspect configs/kimi-k3 | grep -v '^  [0-9]*: '
$myriad inspect configs/tiny | grep -v '^  [0-9]*: '
