#!/usr/bin/env bash
# CPU training speed in one run: the four figures docs/PERFORMANCE.md tracks for training, each
# against the f32 FMA peak that bench_model measures in the same run (bench_util.h: independent
# FMA chains on every thread; a shared VM's peak drifts, so each figure is quoted against the
# probe of its own run and the date and load are printed):
#   1. the f32 full AdamW training step of scripts/bench_model.sh's 30M Kimi-Linear-form model
#      (random init, B=2, T=1024): model GFLOP/s over the peak;
#   2. bf16 against f32 training tokens/s, the rounds alternating f32 and bf16 (the ratio per
#      round), and both loss curves over the same steps;
#   3. the KDA chunk kernel's forward + backward at B=1, T=4096, H=4, K=V=64 (bench_kda; FLOPs by
#      MODEL.md's count, 3x the forward's), with f32 inputs and with bf16 ones (bf16 training's;
#      on an AMX CPU their products run on the tile unit), both against the f32 peak; each the
#      best of ROUNDS repetitions, as the peak is the best of its ROUNDS probes;
#   4. one MoE FFN layer's forward + backward alone (bench_model --profile=2, median of 50).
#
#   scripts/bench_training.sh         settings: OMP_NUM_THREADS (2), ROUNDS (3), STEPS (8),
#                                     MYRIAD_BUILD (build/release; built when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-8}
build=${MYRIAD_BUILD:-build/release}
dir=$build/bench_training
mkdir -p "$dir"
if [ ! -x "$build/bench_model" ] || [ ! -x "$build/bench_kda" ]; then
  echo "== building bench_model and bench_kda in $build =="
  [ -f "$build/CMakeCache.txt" ] || cmake --preset release >/dev/null
  cmake --build "$build" -j "${MYRIAD_JOBS:-2}" --target bench_model bench_kda
fi
# The model of scripts/bench_model.sh (its config, written there between <<'EOF' and EOF).
awk '/<<.EOF.$/ { on = 1; next } /^EOF$/ { on = 0 } on' scripts/bench_model.sh >"$dir/config.json"

load() { cut -d' ' -f1-3 /proc/loadavg; }
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }
step() {  # precision flag, log
  "$build/bench_model" "$dir/config.json" --B=2 --T=1024 --steps="$STEPS" --warmup=2 --adamw=1 \
    "$1" >"$2" 2>&1
  grep '^RESULT' "$2" | tail -1
}

echo "== CPU training figures, $(date -u '+%Y-%m-%d %H:%M UTC'), $OMP_NUM_THREADS threads, load $(load) =="
declare -a f32_tps bf16_tps f32_frac peaks
for ((r = 1; r <= ROUNDS; ++r)); do
  a=$(step --bf16=0 "$dir/f32.$r.log")
  b=$(step --bf16=1 "$dir/bf16.$r.log")
  f32_tps[r]=$(field "$a" tokens_per_s) bf16_tps[r]=$(field "$b" tokens_per_s)
  f32_frac[r]=$(field "$a" frac_peak) peaks[r]=$(field "$a" peak_gflops)
  printf "  round %d: f32 %7.1f tokens/s (%5.1f%% of the in-run peak %.0f GFLOP/s), bf16 %7.1f tokens/s: bf16/f32 %.2f  (load %s)\n" \
    "$r" "${f32_tps[r]}" "$(awk -v x="${f32_frac[r]}" 'BEGIN { print 100 * x }')" "${peaks[r]}" \
    "${bf16_tps[r]}" "$(awk -v a="${bf16_tps[r]}" -v b="${f32_tps[r]}" 'BEGIN { print a / b }')" "$(load)"
done

echo "-- loss per step, round 1 (the same init and batches)"
paste <(grep -E '^  step ' "$dir/f32.1.log" | awk '{ print $2, $NF }') \
  <(grep -E '^  step ' "$dir/bf16.1.log" | awk '{ print $NF }') |
  awk '{ printf "  step %2d  f32 %.6f  bf16 %.6f  (bf16 - f32 %+.6f)\n", $1, $2, $3, $3 - $2 }'

kda=$("$build/bench_kda" --reference=0 --benchmark_repetitions="$ROUNDS" 2>&1 |
  tee "$dir/kda.log" | awk '/chunked forward\+backward/ { print $3 }')
kda_bf16=$("$build/bench_kda" --bf16=1 --benchmark_repetitions="$ROUNDS" 2>&1 |
  tee "$dir/kda_bf16.log" | awk '/chunked forward\+backward/ { print $3 }')
moe=$("$build/bench_model" "$dir/config.json" --B=2 --T=1024 --steps=1 --warmup=0 --profile=2 2>&1 |
  tee "$dir/moe.log" | awk '/MoE FFN/ { print $4, $7 }')
moe_peak=$(grep '^RESULT' "$dir/moe.log" | tail -1)
moe_peak=$(field "$moe_peak" peak_gflops)

median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
declare -a ratios fracs
for ((r = 1; r <= ROUNDS; ++r)); do
  ratios[r]=$(awk -v a="${bf16_tps[r]}" -v b="${f32_tps[r]}" 'BEGIN { print a / b }')
  fracs[r]=$(awk -v x="${f32_frac[r]}" 'BEGIN { print 100 * x }')
done
peak=$(printf '%s\n' "${peaks[@]}" | sort -g | tail -1)
rmed=$(median "${ratios[@]}") fmed=$(median "${fracs[@]}")
rlo=$(printf '%s\n' "${ratios[@]}" | sort -g | head -1) rhi=$(printf '%s\n' "${ratios[@]}" | sort -g | tail -1)
flo=$(printf '%s\n' "${fracs[@]}" | sort -g | head -1) fhi=$(printf '%s\n' "${fracs[@]}" | sort -g | tail -1)
read -r moe_ms moe_gf <<<"$moe"
if [ -z "$kda" ] || [ -z "$kda_bf16" ] || [ -z "$moe_gf" ] || [ -z "$moe_peak" ]; then
  echo "bench_kda or bench_model --profile=2 printed no figure (logs in $dir)" >&2
  exit 1
fi
echo
echo "| figure | measured (median and range of the rounds) | target |"
echo "|---|---:|---:|"
printf "| f32 training step, of the in-run f32 peak | %.1f%% (%.1f-%.1f) | 50%% |\n" "$fmed" "$flo" "$fhi"
printf "| bf16 / f32 training tokens/s | %.2f (%.2f-%.2f) | 1.6 |\n" "$rmed" "$rlo" "$rhi"
printf "| KDA chunk fwd+bwd, of the best in-run peak (%.0f GFLOP/s) | %.1f%% (%.1f GFLOP/s) | 40%% |\n" \
  "$peak" "$(awk -v k="$kda" -v p="$peak" 'BEGIN { print 100 * k / p }')" "$kda"
printf "| KDA chunk fwd+bwd with bf16 inputs, of the same f32 peak | %.1f%% (%.1f GFLOP/s) | (40%% is the f32 row's) |\n" \
  "$(awk -v k="$kda_bf16" -v p="$peak" 'BEGIN { print 100 * k / p }')" "$kda_bf16"
printf "| MoE FFN fwd+bwd, of its run's peak (%.0f GFLOP/s) | %.1f%% (%.1f GFLOP/s, %.2f ms) | 60%% |\n" \
  "$moe_peak" "$(awk -v m="$moe_gf" -v p="$moe_peak" 'BEGIN { print 100 * m / p }')" "$moe_gf" "$moe_ms"
echo "RESULT f32_frac=$(awk -v x="$fmed" 'BEGIN { print x / 100 }') bf16_ratio=$rmed kda_gflops=$kda kda_bf16_gflops=$kda_bf16 moe_gflops=$moe_gf peak_gflops=$peak load=\"$(load)\""
