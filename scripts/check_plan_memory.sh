#!/usr/bin/env bash
# The planner's training-memory model against a measured CPU run (planner issue: "predicted memory
# for small CPU training runs is within 15% of measured peak"). For each optimiser (Muon, AdamW),
# precision (f32, bf16 with fp32 master) and size (seq x batch), bench_train_memory
# (bench/bench_train_memory.cpp) trains the preset for a few steps as the trainer does, measures
# the CPU arena's peak tensor bytes above the pre-model baseline, and compares them with
# plan::training_memory (what `myriad plan --gpu zen5` reports) for the same config, seq, batch
# (one micro-batch), optimiser and precision. Prints both; exits 1 when any case is off by more
# than TOLERANCE.
#
# Settings (environment): PRESET (tiny), SIZES ("64x2 256x8 1024x2"), STEPS (2), TOLERANCE (0.15),
# OMP_NUM_THREADS (1), MYRIAD_BUILD (build/release; bench_train_memory is built there when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PRESET=${PRESET:-tiny} SIZES=${SIZES:-"64x2 256x8 1024x2"} STEPS=${STEPS:-2}
TOLERANCE=${TOLERANCE:-0.15}
build=${MYRIAD_BUILD:-build/release}
if [ ! -x "$build/bench_train_memory" ]; then
  echo "== building bench_train_memory in $build =="
  [ -f "$build/CMakeCache.txt" ] || cmake --preset release >/dev/null
  cmake --build "$build" -j "${MYRIAD_JOBS:-2}" --target bench_train_memory
fi

fail=0
printf '%-6s %-5s %-10s %12s %12s %8s\n' optim prec "seq x B" "plan MiB" "measured" ratio
for size in $SIZES; do
  seq=${size%x*} batch=${size#*x}
  for bf16 in 0 1; do
    for adamw in 0 1; do
      out=$("$build/bench_train_memory" "$PRESET" --seq="$seq" --batch="$batch" --steps="$STEPS" \
        --adamw=$adamw --bf16=$bf16 --tolerance="$TOLERANCE") || rc=$?
      res=$(grep '^RESULT' <<<"$out")
      [ "${rc:-0}" = 1 ] && fail=1
      [ "${rc:-0}" -gt 1 ] && { echo "$out"; exit 2; }
      unset rc
      get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$res"; }
      printf '%-6s %-5s %-10s %12s %12s %8s %s\n' "$([ $adamw = 1 ] && echo adamw || echo muon)" \
        "$([ $bf16 = 1 ] && echo bf16 || echo f32)" "${seq}x${batch}" "$(get predicted_mib)" \
        "$(get measured_mib)" "$(get ratio)" "${res##* }"
    done
  done
done
if [ $fail = 1 ]; then
  echo "FAIL: predicted training memory off by more than $TOLERANCE in at least one case"
  exit 1
fi
echo "OK: every case within $TOLERANCE of the measured peak"
