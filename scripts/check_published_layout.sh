#!/usr/bin/env bash
# `myriad serve` on a model directory laid out like a published Kimi checkpoint (tiktoken.model,
# tokenizer_config.json with added_tokens_decoder and a Jinja chat_template, config.json with an
# FP8 quantization_config, model.safetensors with F8_E4M3 weights + F32 weight_scale_inv,
# generation_config.json), checked with `myriad inspect` and the official openai client
# (tools/reference/openai_published_check.py: chat, prompt-token parity with a transformers-style
# rendering tokenized by tiktoken, streaming, forced / required tool calls, tool results, 4xx).
#   scripts/check_published_layout.sh [MODEL_DIR]
# Default MODEL_DIR: tests/fixtures/published/kimi_fp8_tiny (tools/reference/published_layout_fixture.py).
# Environment: MYRIAD_BIN (default build/release/myriad), MYRIAD_PORT (default: any free port),
# MYRIAD_OPENAI_CHECK_PYTHON (default: tools/reference/.venv/bin/python if present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
myriad=${MYRIAD_BIN:-build/release/myriad}
model=${1:-tests/fixtures/published/kimi_fp8_tiny}
if [ -n "${MYRIAD_OPENAI_CHECK_PYTHON:-}" ]; then
  py=$MYRIAD_OPENAI_CHECK_PYTHON
elif [ -x tools/reference/.venv/bin/python ]; then
  py=tools/reference/.venv/bin/python
else
  py=python3
fi
work=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"' EXIT

# inspect: the tokenizer, template and quantization must be read as published.
$myriad inspect "$model" >"$work/inspect.txt"
sed -n '/^files/,$p' "$work/inspect.txt"
expect() {
  grep -Eq "$1" "$work/inspect.txt" || { echo "FAILED: myriad inspect: no line matching '$1'" >&2; exit 1; }
}
expect '^  tokenizer +tiktoken, '
expect '^  chat template +Jinja .*Kimi tool calls'
expect '^  quantization +fp8, e4m3'
expect '^  generation config +eos '

$myriad serve "$model" --port "${MYRIAD_PORT:-0}" >"$work/serve.log" 2>&1 &
server=$!
port=
for _ in $(seq 300); do
  port=$(sed -n 's|^myriad serve: model .* on http://[^:]*:\([0-9]*\) .*|\1|p' "$work/serve.log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$work/serve.log" >&2; echo "FAILED: myriad serve exited" >&2; exit 1; }
  port=
  sleep 0.2
done
[ -n "$port" ] || { cat "$work/serve.log" >&2; echo "FAILED: myriad serve did not come up" >&2; exit 1; }
grep -v '^myriad serve: model' "$work/serve.log" | sed 's/^/serve: /' || true
name=$(basename "$(cd "$model" && pwd)")
$py tools/reference/openai_published_check.py "http://127.0.0.1:$port/v1" "$name" "$model"
kill -0 "$server" 2>/dev/null || { cat "$work/serve.log" >&2; echo "FAILED: myriad serve died" >&2; exit 1; }
echo "ok: $model served as published (tiktoken, Jinja template, fp8) and checked with the openai client"
