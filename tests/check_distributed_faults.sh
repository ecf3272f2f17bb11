#!/usr/bin/env bash
# Faults in a data-parallel run (docs/DISTRIBUTED.md), through the CLI under mpirun -np 2:
#   1. kill -9 one rank mid-run: the job ends with a non-zero status and a message within the
#      timeout; `--resume` continues from the last complete checkpoint and the final weights are
#      bit-identical to an uninterrupted one-process run (no completed step lost, none repeated);
#   2. SIGSTOP one rank (a hang): the other rank's watchdog ends the job after [parallel]
#      timeout_s with a message naming the collective, instead of waiting forever.
# Usage: tests/check_distributed_faults.sh MYRIAD_BINARY   (skips when mpirun is absent)
set -euo pipefail
bin=$(realpath "${1:-build/release/myriad}")
command -v mpirun >/dev/null || {
  echo "check_distributed_faults: no mpirun; skipped"
  exit 0
}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
work=$(mktemp -d /tmp/myriad-faults-XXXXXX)
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
timeout_s=8
cat >"$work/r.toml" <<EOF
seed = 5
balancer = "quantile"
[model]
preset = "tiny"
[model.overrides]
num_hidden_layers = 2
hidden_size = 64
intermediate_size = 128
moe_intermediate_size = 32
layer_types = ["linear_attention", "full_attention"]
linear_attn_config = { kda_layers = [1], full_attn_layers = [2] }
[data]
tokenizer = "$work/tok.model"
shard_dir = "$work/shards"
corpus = "synthetic"
vocab_size = 320
max_corpus_bytes = 200000
shard_tokens = 100000
[optimizer]
lr = 1e-2
[schedule]
kind = "constant"
[checkpoint]
every = 1
keep_last = 2
[log]
tensorboard = false
html = false
[parallel]
timeout_s = $timeout_s
[[stage]]
name = "s0"
seq_len = 64
steps = 40
tokens_per_step = 2048
batch_size = 2
EOF

echo "== reference: one process, uninterrupted =="
"$bin" train "$work/r.toml" --out "$work/one" >"$work/one.log" 2>&1 || {
  cat "$work/one.log"
  exit 1
}

# latest_step DIR: the step of the newest complete checkpoint (0 when none).
latest_step() {
  local l
  l=$(cat "$1/checkpoints/latest" 2>/dev/null || true)
  [ -n "$l" ] && echo $((10#${l#step-})) || echo 0
}
# wait_step DIR N: until the run in DIR has a checkpoint at step >= N (60 s at most).
wait_step() {
  for _ in $(seq 600); do
    [ "$(latest_step "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  echo "no checkpoint at step $2 after 60 s" >&2
  return 1
}
# rank_pid DIR R: the pid of rank R of the run writing to DIR.
rank_pid() {
  for p in $(pgrep -f -- "--out $1"); do
    [ "$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')" = "$2" ] &&
      echo "$p" && return 0
  done
  return 1
}

echo "== kill -9 one rank mid-run =="
mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS "$bin" train "$work/r.toml" --out "$work/dp" \
  >"$work/dp.log" 2>&1 &
job=$!
wait_step "$work/dp" 5
victim=$(rank_pid "$work/dp" 1)
t0=$(date +%s.%N)
kill -9 "$victim"
rc=0
wait "$job" || rc=$?
took=$(echo "$(date +%s.%N) - $t0" | bc)
saved=$(latest_step "$work/dp")
echo "rank 1 killed; mpirun exited with status $rc after ${took} s; last checkpoint: step $saved"
[ "$rc" -ne 0 ] || { echo "FAIL: the job reported success after a rank was killed"; exit 1; }
(($(echo "$took < $timeout_s + 20" | bc))) || { echo "FAIL: took ${took} s to end"; exit 1; }
grep -E "signal 9|Killed|killed" "$work/dp.log" | head -3

echo "== resume after the kill, at 2 ranks =="
mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS "$bin" train "$work/r.toml" --out "$work/dp" \
  --resume >"$work/resume.log" 2>&1 || {
  cat "$work/resume.log"
  exit 1
}
grep -m1 "resumed from step" "$work/resume.log"
if cmp -s "$work/one/model/model.safetensors" "$work/dp/model/model.safetensors"; then
  echo "final weights bit-identical to the uninterrupted one-process run"
else
  echo "FAIL: the resumed run's weights differ from the uninterrupted run's"
  exit 1
fi

echo "== SIGSTOP one rank (a hang) =="
mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS "$bin" train "$work/r.toml" --out "$work/hang" \
  >"$work/hang.log" 2>&1 &
job=$!
wait_step "$work/hang" 3
victim=$(rank_pid "$work/hang" 1)
t0=$(date +%s.%N)
kill -STOP "$victim"
rc=0
wait "$job" || rc=$?
took=$(echo "$(date +%s.%N) - $t0" | bc)
kill -KILL "$victim" 2>/dev/null || true
echo "rank 1 stopped; mpirun exited with status $rc after ${took} s (timeout_s = $timeout_s)"
grep -m1 "waited" "$work/hang.log" || { echo "FAIL: no watchdog message"; cat "$work/hang.log"; exit 1; }
[ "$rc" -ne 0 ] || { echo "FAIL: the job reported success"; exit 1; }
(($(echo "$took < $timeout_s + 30" | bc))) || { echo "FAIL: took ${took} s to end"; exit 1; }
echo "check_distributed_faults: OK"
