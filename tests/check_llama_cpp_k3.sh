#!/usr/bin/env bash
# Myriad's Kimi-K3 forward pass against llama.cpp, a second independent engine, and an f64 NumPy
# forward written from MODEL.md (tools/reference/llama_cpp_k3.py). Needs the llama.cpp build of
# scripts/peers/llama_cpp.sh (build/peers/); skips, exit 0, when it is absent. Not part of
# scripts/test.sh.
#
# Settings (environment): MYRIAD (build/cpu/myriad), PEERS_DIR (build/peers), TOLERANCE (1e-3,
# max|d| / max|ref| for the comparisons the driver gates on), WORK (PEERS_DIR/k3check-test).
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS_DIR:-build/peers}
MYRIAD=${MYRIAD:-build/cpu/myriad}
missing=()
[ -x "$PEERS/bin/llama_logits" ] || missing+=("$PEERS/bin/llama_logits")
[ -x "$PEERS/venv/bin/python" ] || missing+=("$PEERS/venv/bin/python")
[ -f "$PEERS/llama.cpp/convert_hf_to_gguf.py" ] || missing+=("$PEERS/llama.cpp")
if (( ${#missing[@]} )); then
  echo "SKIP check_llama_cpp_k3: no llama.cpp build (missing ${missing[*]}); run scripts/peers/llama_cpp.sh"
  exit 0
fi
if [ ! -x "$MYRIAD" ]; then
  echo "SKIP check_llama_cpp_k3: $MYRIAD not built (set MYRIAD=path/to/myriad)"
  exit 0
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} LLAMA_LOGITS_QUIET=1
exec "$PEERS/venv/bin/python" tools/reference/llama_cpp_k3.py \
  --myriad "$MYRIAD" --work "${WORK:-$PEERS/k3check-test}" \
  --llama-dir "$PEERS/llama.cpp" --llama-logits "$PEERS/bin/llama_logits" \
  --tol "${TOLERANCE:-1e-3}" "$@" 2> >(grep -v '^INFO:\|^WARNING:' >&2)
