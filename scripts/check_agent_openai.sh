#!/usr/bin/env bash
# The official openai client drives an agent model through `myriad serve` (tool definitions,
# tool_calls, tool messages) and is scored by the environment code the RL evaluator runs; its
# greedy result on every held-out task must equal `myriad agent-eval`'s greedy rollout through
# the engine, message for message.
#   scripts/check_agent_openai.sh [MODEL_DIR ENV TASKS]
# Without arguments: trains a small calculator SFT model for the check (about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
myriad=${MYRIAD_BIN:-build/release/myriad}
py=${MYRIAD_OPENAI_CHECK_PYTHON:-python3}
work=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
server=
if [ $# -ge 3 ]; then
  model=$1 env=$2 tasks=$3
else
  sed 's/^steps = .*/steps = 60/; s/^decay_steps = .*/decay_steps = 20/; s/^sft_examples = .*/sft_examples = 2000/' \
    configs/recipes/agent/calculator-sft.toml >"$work/sft.toml"
  $myriad train "$work/sft.toml" --out "$work/sft" >"$work/sft.log"
  model=$work/sft/model env=calculator tasks=12
fi
port=${MYRIAD_PORT:-8779}
$myriad serve "$model" --port "$port" >"$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.2
done
$py tools/reference/openai_agent_check.py "http://127.0.0.1:$port/v1" model "$myriad" "$env" \
  "$tasks" "$work/client.json"
$myriad agent-eval "$model" --env "$env" --tasks "$tasks" --k 1 --json "$work/engine.json" |
  tail -1
$py - "$work/client.json" "$work/engine.json" <<'PY'
import json, sys
client, engine = (json.load(open(p)) for p in sys.argv[1:3])
bad = [i for i, (a, b) in enumerate(zip(client["texts"], engine["greedy_texts"])) if a != b]
for i in bad[:3]:
    print(f"task {i}: client {client['texts'][i]!r}\n        engine {engine['greedy_texts'][i]!r}")
assert client["solved"] == engine["greedy_solved"], (client["solved"], engine["greedy_solved"])
assert not bad, f"{len(bad)} of {len(client['texts'])} tasks differ"
print(f"ok: the openai client loop and the engine's greedy rollouts agree on all "
      f"{len(client['texts'])} tasks (solved {sum(client['solved'])})")
PY
