#!/usr/bin/env bash
# The official openai client sends Fashion-MNIST test images as PNG data URLs to `myriad serve`
# and scores the replies; they must equal `myriad vision-eval`'s greedy replies on the same images
# (same accuracy and confusion, and reply for reply where the eval JSON keeps them). Remote URLs,
# corrupt PNGs and GIFs must be 400s (openai.BadRequestError) and the server must keep serving.
#   scripts/check_vision_openai.sh [MODEL_DIR [N]]
# MODEL_DIR: a model with a vision tower; without it, a small one is trained for the check (150
# steps of configs/recipes/vision/fashion-main.toml). N: test images (default 50).
# MYRIAD_BIN: the myriad binary (default build/release/myriad, else build/cpu/myriad);
# MYRIAD_OPENAI_CHECK_PYTHON: the python (default python3; openai is installed into
# tools/reference/.venv when it lacks it); MYRIAD_PORT: the port (default 8781).
set -euo pipefail
cd "$(dirname "$0")/.."
myriad=${MYRIAD_BIN:-build/release/myriad}
[ -x "$myriad" ] || [ -n "${MYRIAD_BIN:-}" ] || myriad=build/cpu/myriad
py=${MYRIAD_OPENAI_CHECK_PYTHON:-python3}
n=${2:-50}
work=$(mktemp -d)
server=
trap 'if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
if [ $# -ge 1 ]; then
  model=$1
else
  sed 's/^steps = .*/steps = 150/; s/^decay_steps = .*/decay_steps = 30/; s/^vision_eval_images = .*/vision_eval_images = 0/' \
    configs/recipes/vision/fashion-main.toml >"$work/vision.toml"
  $myriad train "$work/vision.toml" --out "$work/vision" >"$work/train.log"
  model=$work/vision/model
fi
[ -f "$model/config.json" ] || { echo "no model at $model" >&2; exit 2; }

# The evaluator's greedy replies on the first N test images, and those images as PNG files.
$myriad vision-eval "$model" --images "$n" --grid 0 --save-images "$work/images" \
  --save-count "$n" --json "$work/eval.json" >"$work/eval.log"
grep -E '^caption +[0-9]' "$work/eval.log"

port=${MYRIAD_PORT:-8781}
$myriad serve "$model" --port "$port" --model-name fashion >"$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 150); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.2
done
if ! curl -sf "http://127.0.0.1:$port/health" >/dev/null; then
  echo "myriad serve did not come up:" >&2
  cat "$work/serve.log" >&2
  exit 1
fi
$py tools/reference/openai_vision_check.py "http://127.0.0.1:$port/v1" fashion "$work/images" \
  "$work/eval.json"
