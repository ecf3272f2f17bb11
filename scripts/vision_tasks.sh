#!/usr/bin/env bash
# The tiny multimodal experiment of docs/VISION.md (TRAINING.md §9), on 2 CPU cores:
#   1. fashion-tiny: the Fashion-MNIST image tower trained jointly with a small KDA/MLA decoder on
#      captions and 2×2 grid questions, a quarter of its rows text (timed);
#   2. fashion-tiny-text: the same decoder on text alone, with the multimodal run's text budget
#      and tokenizer (the contrast for "language ability is kept"), and fashion-tiny-text-all
#      with its whole budget as text (four times the text);
#   3. the multimodal model on all 10,000 test images (greedy exact match, confusion) and 1,000
#      questions of each grid kind;
#   4. both models' held-out text loss on the same 262,144 held-out tokens;
#   5. the official openai client sending test PNGs as data URLs to `myriad serve`.
#   scripts/vision_tasks.sh [OUT_DIR]      (default runs/vision; about 45 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "${MYRIAD_JOBS:-2}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
myriad=build/release/myriad
out=${1:-runs/vision}
mkdir -p "$out"
start=$(date +%s)
$myriad train configs/recipes/vision/fashion-tiny.toml --out "$out/fashion-tiny" | grep -v '^\[' || true
echo "multimodal training took $(( $(date +%s) - start )) s (tokenizer, shards and four evaluations of 500 test images included)"
for run in fashion-tiny-text fashion-tiny-text-all; do
  $myriad train configs/recipes/vision/$run.toml --out "$out/$run" | grep -v '^\[' || true
done
$myriad vision-eval "$out/fashion-tiny/model" --images 10000 --grid 1000 \
  --json "$out/fashion-tiny/eval.json"
for run in fashion-tiny fashion-tiny-text fashion-tiny-text-all; do
  echo -n "$run: "
  $myriad eval "$out/$run/model" --tasks passkey --lengths 64 --seeds 1 \
    --heldout "$out/fashion-tiny/shards" --loss-lengths 128 --loss-tokens 262144 |
    grep 'held-out loss'
done
scripts/check_vision_openai.sh "$out/fashion-tiny/model"
