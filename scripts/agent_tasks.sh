#!/usr/bin/env bash
# The post-training experiment of docs/POSTTRAINING.md: for each tiny agentic task of TRAINING.md
# §8 (calculator, kv_lookup, gridworld), SFT from scratch on the scripted expert's traces, then RL
# from the SFT model twice: with process rewards (λ_p = 0.5) and without (λ_p = 0, the contrast).
# Every model is measured on the same 200 held-out tasks with 8 samples each (pass@1 with its 95%
# interval, pass@8 with its Wilson interval, greedy pass@1); the SFT row is the RL run's step-0
# evaluation, so SFT and RL are measured with the same sampling seeds. Tasks run in parallel, one thread
# each; a summary table goes to runs/agent/summary.md.
#   scripts/agent_tasks.sh [TASK ...]     (default: all three; about 35 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh >/dev/null
cmake --preset release >/dev/null
cmake --build --preset release -j "${MYRIAD_JOBS:-2}" >/dev/null
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
myriad=build/release/myriad
tasks=("$@")
[ ${#tasks[@]} -eq 0 ] && tasks=(calculator kv_lookup gridworld)
out=runs/agent
mkdir -p "$out"

one() {
  local t=$1 d=$out/$1
  local s=$(date +%s)
  [ -f "$d-sft/model/model.safetensors" ] ||
    $myriad train "configs/recipes/agent/$t-sft.toml" --out "$d-sft" >"$d-sft.log" 2>&1
  echo "$t: SFT took $(( $(date +%s) - s )) s" >"$d-time.txt"
  s=$(date +%s)
  sed "s#runs/agent/$t-sft/model#$d-sft/model#" "configs/recipes/agent/$t-rl.toml" >"$d-rl.toml"
  $myriad rl "$d-rl.toml" --out "$d-rl" >"$d-rl.log" 2>&1
  echo "$t: RL took $(( $(date +%s) - s )) s" >>"$d-time.txt"
  # The contrast: the same RL without process rewards.
  sed 's/^lambda_process = .*/lambda_process = 0.0/' "$d-rl.toml" >"$d-rl-noprocess.toml"
  $myriad rl "$d-rl-noprocess.toml" --out "$d-rl-noprocess" >"$d-rl-noprocess.log" 2>&1
  if [ "$t" = calculator ]; then  # the PPO + GAE alternative
    sed "s#runs/agent/$t-sft/model#$d-sft/model#" "configs/recipes/agent/$t-rl-gae.toml" >"$d-rl-gae.toml"
    $myriad rl "$d-rl-gae.toml" --out "$d-rl-gae" >"$d-rl-gae.log" 2>&1
  fi
}

for t in "${tasks[@]}"; do one "$t" & done
wait

python3 - "$out" "${tasks[@]}" <<'PY'
import json, sys
out, tasks = sys.argv[1], sys.argv[2:]
rows = ["| task | model | pass@1 (95% CI) | pass@8 (95% CI) | greedy pass@1 | mean R | "
        "tool-call rate | tool-error rate | turns |", "|---|---|---|---|---|---|---|---|---|"]
def row(t, label, e):
    rows.append(f"| {t} | {label} | {e['pass@1']:.3f} ± {e['pass@1_ci95']:.3f} | "
                f"{e['pass@k']:.3f} [{e['pass@k_lo']:.3f}, {e['pass@k_hi']:.3f}] | "
                f"{e['greedy_pass@1']:.3f} | {e['mean_reward']:.3f} | {e['tool_call_rate']:.2f} | "
                f"{e['tool_error_rate']:.2f} | {e['mean_turns']:.2f} |")
for t in tasks:
    row(t, "SFT", json.load(open(f"{out}/{t}-rl/eval.json"))[0])
    row(t, "SFT + RL", json.load(open(f"{out}/{t}-rl/eval.json"))[-1])
    row(t, "SFT + RL, no process reward", json.load(open(f"{out}/{t}-rl-noprocess/eval.json"))[-1])
    if t == "calculator":
        row(t, "SFT + RL, PPO + GAE", json.load(open(f"{out}/{t}-rl-gae/eval.json"))[-1])
open(f"{out}/summary.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
cat "$out"/*-time.txt
