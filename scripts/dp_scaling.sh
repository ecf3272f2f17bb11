#!/usr/bin/env bash
# Data-parallel training speed on this machine (docs/DISTRIBUTED.md, "Speed on this machine"):
# the tiny-cpu recipe's first stage (seq 256, 8192 tokens per step in 4 micro-batches), run in
# turns as one process with 2 OpenMP threads, one process with 1 thread, and `mpirun -np 2` with
# 1 thread per rank, and `mpirun -np 2` with the experts shared out (ep = 2). Prints tokens/s (median over steps 3..STEPS of each run, then the median over
# REPS rounds), the ratios, the share of the step spent in collectives, and whether the 2-rank
# run's final weights equal the 1-thread run's bit for bit (deterministic mode: they must).
# Settings (environment): STEPS (12), REPS (2), MYRIAD_BUILD (build/release).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MYRIAD_BUILD:-build/release}
bin=$(realpath "$build/myriad")
STEPS=${STEPS:-12} REPS=${REPS:-2}
command -v mpirun >/dev/null || {
  echo "dp_scaling: mpirun missing (scripts/install-deps.sh installs Open MPI)" >&2
  exit 2
}
export OMP_WAIT_POLICY=PASSIVE OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d /tmp/myriad-dp-scaling-XXXXXX)
trap 'rm -rf "$work"' EXIT
# tiny-cpu.toml with one stage of STEPS steps, data shared by every run, no TensorBoard/HTML.
awk -v steps="$STEPS" -v work="$work" '
  /^\[\[stage\]\]/ { n++ } n >= 2 { next }
  /^steps = / { print "steps = " steps; next }
  /^warmup = / { print "warmup = 2"; next }
  /^decay_steps = / { print "decay_steps = 3"; next }
  /^tokenizer = / { print "tokenizer = \"" work "/tokenizer.model\""; next }
  /^shard_dir = / { print "shard_dir = \"" work "/shards\""; next }
  /^tensorboard = / { print "tensorboard = false"; next }
  /^html = / { print "html = false"; next }
  /^every = 25/ { print "every = 1000"; next }
  { print }' configs/recipes/tiny-cpu.toml >"$work/r.toml"
cp "$work/r.toml" "$work/r-ep.toml"
printf '\n[parallel]\nep = 2\n' >>"$work/r-ep.toml"

echo "== data (tokenizer and shards, once) =="
OMP_NUM_THREADS=2 "$bin" train "$work/r.toml" --out "$work/warm" >/dev/null

# tokens/s median over steps 3.. and the median share of the step in collectives.
measure() {
  python3 - "$1/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = [j for j in map(json.loads, open(sys.argv[1])) if "perf/tokens_per_s" in j][2:]
tps = statistics.median(r["perf/tokens_per_s"] for r in rows)
comm = statistics.median(r.get("comm/seconds", 0) / r["perf/step_seconds"] for r in rows)
print(f"{tps:.0f} {comm:.4f}")
EOF
}
declare -A tps comm
for rep in $(seq "$REPS"); do
  for cfg in t2 t1 dp2 ep2; do
    out="$work/$cfg-$rep"
    case $cfg in
      t2) OMP_NUM_THREADS=2 "$bin" train "$work/r.toml" --out "$out" >/dev/null ;;
      t1) OMP_NUM_THREADS=1 "$bin" train "$work/r.toml" --out "$out" >/dev/null ;;
      dp2) OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
        "$bin" train "$work/r.toml" --out "$out" >/dev/null ;;
      ep2) OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
        "$bin" train "$work/r-ep.toml" --out "$out" >/dev/null ;;
    esac
    read -r t c < <(measure "$out")
    tps[$cfg]+="$t " comm[$cfg]+="$c "
    echo "round $rep  $cfg: $t tokens/s"
  done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
t2=$(median "${tps[t2]}") t1=$(median "${tps[t1]}") d2=$(median "${tps[dp2]}")
c2=$(median "${comm[dp2]}") e2=$(median "${tps[ep2]}") ce=$(median "${comm[ep2]}")
same=no
cmp -s "$work/t1-1/model/model.safetensors" "$work/dp2-1/model/model.safetensors" && same=yes
echo
echo "tiny-cpu stage 1 (seq 256, 4 micro-batches of 8 x 256 per step), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| run | tokens/s (median of $REPS) |"
echo "|---|---|"
echo "| one process, 2 threads | $t2 |"
echo "| one process, 1 thread | $t1 |"
echo "| mpirun -np 2, 1 thread each | $d2 |"
echo "| mpirun -np 2, 1 thread each, ep = 2 | $e2 |"
awk -v d="$d2" -v a="$t1" -v b="$t2" -v c="$c2" 'BEGIN {
  printf "2 ranks / 1 thread: %.2fx; 2 ranks / 2 threads: %.2fx; collectives %.1f%% of the 2-rank step\n", d / a, d / b, 100 * c }'
awk -v e="$e2" -v d="$d2" -v c="$ce" 'BEGIN {
  printf "ep = 2 / dp only: %.2fx; collectives %.1f%% of the ep = 2 step\n", e / d, 100 * c }'
echo "2-rank final weights bit-identical to the 1-thread run: $same"
[ "$same" = yes ]
