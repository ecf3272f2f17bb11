#!/usr/bin/env bash
# Whole-model training throughput, Myriad against PyTorch on the CPU, side by side: forward +
# mean next-token cross-entropy + backward of the same Kimi-Linear-form model, same weights, same
# batch, same thread count.
#   Myriad: build/…/bench_model (bench/bench_model.cpp), f32, the decoder's fused LM-head loss.
#   PyTorch: tools/reference/bench_torch_cpu.py, transformers' KimiLinearForCausalLM, f32, with
#            fla hidden so its torch-only chunked KDA runs (the script prints the path taken).
# The config (written below; MODEL.md §5 layout): hidden 256, 8 layers, KDA at 1-based layers
# 1-3 and 5-7 (4 heads x 64, conv 4), MLA at 4 and 8 (4 heads, kv_lora_rank 128, q_lora none,
# d_nope 64 / d_pe 32 / d_v 64, NoPE), layer 0 dense SwiGLU (width 704), layers 1-7 MoE with 32
# routed experts top-4 (width 128) + 1 shared, sigmoid router, vocab 8192: 30.0M parameters,
# 10.8M active per token. transformers initialises it and saves it; both sides load that
# checkpoint and draw the same tokens, so their losses agree (checked below).
# Runs alternate, Myriad / torch / Myriad / torch ..., so machine noise hits both; `uptime` is
# printed around each. Reported: tokens/s per run (median step) and the ratio per round; the
# best run of each side; the fastest single step of each side over all rounds (the figure least
# disturbed by other load on the machine); and model FLOP/s of Myriad's best run as a fraction of
# the measured f32 FMA peak (bench_util.h, best over the runs), with
#   model FLOP per token = 6 (active params - V d) + attention, per step x B T, where attention
#   is MLA 3 H 2 (d_qk + d_v) T(T+1)/2 per sequence and KDA 3 H (6 T d^2 + 3 T C d + T C^2) per
#   sequence, C = 64 (bench/bench_model.cpp computes it).
#
# ADAMW=1 makes every step a full training step on both sides: zero grad, forward + loss +
# backward, global-norm clipping to 1 and AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, wd 0.1) on all
# parameters (Myriad: train::Optimizer with matrix_optimizer = "adamw"; torch: clip_grad_norm_ +
# torch.optim.AdamW). The loss check then compares the first step's loss (before any update).
# Settings (environment): OMP_NUM_THREADS (2), B (2), T (1024), STEPS (6), WARMUP (2), ROUNDS (2),
# PROFILE=1 (per-layer-type profiles in round 1), MYRIAD_BUILD (build/release; bench_model is
# built there when missing), MYRIAD_BENCH_DIR (build/bench_model: config, checkpoint, logs),
# MYRIAD_REF_PYTHON (else tools/reference/.venv, else /work/.venv-ref, else python3, with which
# bench_torch_cpu.py creates tools/reference/.venv from requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
B=${B:-2} T=${T:-1024} STEPS=${STEPS:-6} WARMUP=${WARMUP:-2} ROUNDS=${ROUNDS:-2}
opt_m="" opt_t="" mode="forward + backward"
if [ "${ADAMW:-0}" = 1 ]; then opt_m="--adamw=1" opt_t="--adamw" mode="full AdamW training steps"; fi
build=${MYRIAD_BUILD:-build/release}
dir=${MYRIAD_BENCH_DIR:-build/bench_model}
mkdir -p "$dir"

py=${MYRIAD_REF_PYTHON:-}
for cand in tools/reference/.venv/bin/python /work/.venv-ref/bin/python python3; do
  [ -n "$py" ] && break
  if [ -x "$cand" ] || command -v "$cand" >/dev/null; then py=$cand; fi
done

if [ ! -x "$build/bench_model" ]; then
  echo "== building bench_model in $build =="
  [ -f "$build/CMakeCache.txt" ] || cmake --preset release >/dev/null
  cmake --build "$build" -j "${MYRIAD_JOBS:-2}" --target bench_model
fi

cat >"$dir/config.json.new" <<'EOF'
{
  "architectures": ["KimiLinearForCausalLM"],
  "model_type": "kimi_linear",
  "dtype": "float32",
  "vocab_size": 8192,
  "hidden_size": 256,
  "intermediate_size": 704,
  "moe_intermediate_size": 128,
  "num_hidden_layers": 8,
  "num_attention_heads": 4,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-05,
  "initializer_range": 0.02,
  "tie_word_embeddings": false,
  "q_lora_rank": null,
  "kv_lora_rank": 128,
  "qk_nope_head_dim": 64,
  "qk_rope_head_dim": 32,
  "v_head_dim": 64,
  "mla_use_nope": true,
  "num_experts": 32,
  "num_experts_per_token": 4,
  "num_shared_experts": 1,
  "moe_renormalize": true,
  "moe_router_activation_func": "sigmoid",
  "routed_scaling_factor": 2.446,
  "use_grouped_topk": false,
  "num_expert_group": 1,
  "topk_group": 1,
  "first_k_dense_replace": 1,
  "moe_layer_freq": 1,
  "num_nextn_predict_layers": 0,
  "hidden_act": "silu",
  "model_max_length": 4096,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "pad_token_id": null,
  "linear_attn_config": {
    "num_heads": 4,
    "head_dim": 64,
    "short_conv_kernel_size": 4,
    "kda_layers": [1, 2, 3, 5, 6, 7],
    "full_attn_layers": [4, 8]
  }
}
EOF
# (Re)create the shared checkpoint when the config changed or it is missing.
if ! cmp -s "$dir/config.json.new" "$dir/config.json" || [ ! -f "$dir/model/model.safetensors" ]; then
  mv "$dir/config.json.new" "$dir/config.json"
  "$py" tools/reference/bench_torch_cpu.py --init "$dir/config.json" --save "$dir/model"
else
  rm "$dir/config.json.new"
fi

result() { grep '^RESULT' "$1" | tail -1; }
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

echo "== bench_model ($mode): B=$B T=$T, $WARMUP warm-up + $STEPS timed steps, OMP_NUM_THREADS=$OMP_NUM_THREADS, $ROUNDS rounds =="
declare -a mt tt ml tl lm lt peaks mmin tmin
fpt=0
for ((r = 1; r <= ROUNDS; ++r)); do
  prof_m="" prof_t=""
  if [ "${PROFILE:-0}" = 1 ] && [ "$r" = 1 ]; then prof_m="--profile=1" prof_t="--profile"; fi
  echo "-- round $r: Myriad (load $(load))"
  "$build/bench_model" "$dir/model" --B="$B" --T="$T" --steps="$STEPS" --warmup="$WARMUP" $prof_m $opt_m |
    tee "$dir/myriad.$r.log"
  res=$(result "$dir/myriad.$r.log")
  mt[r]=$(field "$res" tokens_per_s) ml[r]=$(field "$res" loss) peaks[r]=$(field "$res" peak_gflops)
  mmin[r]=$(field "$res" step_min_ms)
  fpt=$(field "$res" flop_per_token) lm[r]=$(load)
  echo "-- round $r: torch (load $(load))"
  "$py" tools/reference/bench_torch_cpu.py "$dir/model" --B "$B" --T "$T" --steps "$STEPS" \
    --warmup "$WARMUP" $prof_t $opt_t 2>&1 | grep -v -e '^Loading weights' -e 'it/s]$' | tee "$dir/torch.$r.log"
  res=$(result "$dir/torch.$r.log")
  tt[r]=$(field "$res" tokens_per_s) tl[r]=$(field "$res" loss) lt[r]=$(load)
  tmin[r]=$(field "$res" step_min_ms)
done

echo
echo "== summary ($mode): B=$B T=$T, $OMP_NUM_THREADS threads, median step of $STEPS after $WARMUP warm-up =="
{
  for ((r = 1; r <= ROUNDS; ++r)); do
    echo "${mt[r]} ${tt[r]} ${ml[r]} ${tl[r]} ${peaks[r]} ${lm[r]// /,} ${lt[r]// /,} ${mmin[r]} ${tmin[r]}"
  done
} | awk -v fpt="$fpt" -v tokens=$((B * T)) '
  { r = NR; m[r] = $1; t[r] = $2; lossm[r] = $3; losst[r] = $4; if ($5 > peak) peak = $5
    printf "  round %d: Myriad %8.1f tokens/s, torch %7.1f tokens/s, ratio %5.2fx  (load after: %s / %s)\n",
      r, $1, $2, $1 / $2, $6, $7
    if ($1 > bm) bm = $1; if ($2 > bt) bt = $2
    if (r == 1 || $8 < fm) fm = $8; if (r == 1 || $9 < ft) ft = $9
    d = $3 - $4; if (d < 0) d = -d; if (d > 1e-3 * ($3 < 0 ? -$3 : $3)) bad = 1 }
  END {
    printf "  best runs: Myriad %.1f tokens/s, torch %.1f tokens/s -> Myriad is %.2fx torch\n", bm, bt, bm / bt
    printf "  fastest steps: Myriad %.1f ms (%.0f tokens/s), torch %.1f ms (%.0f tokens/s) -> %.2fx\n",
      fm, 1e3 * tokens / fm, ft, 1e3 * tokens / ft, ft / fm
    printf "  model FLOP per token %.4g (6 x active non-embedding params + attention)\n", fpt
    printf "  measured f32 peak %.1f GFLOP/s (best of the runs)\n", peak
    printf "  Myriad %.2f GFLOP/s = %.1f%% of peak; torch %.2f GFLOP/s = %.2f%% of peak\n",
      bm * fpt * 1e-9, 100 * bm * fpt * 1e-9 / peak, bt * fpt * 1e-9, 100 * bt * fpt * 1e-9 / peak
    printf "  losses (same weights, same batch): Myriad %s, torch %s: %s\n", lossm[1], losst[1],
      bad ? "DIFFER" : "agree"
    printf "RESULT ratio=%.3f fastest_step_ratio=%.3f myriad_tokens_per_s=%.1f torch_tokens_per_s=%.1f frac_peak=%.4f\n",
      bm / bt, ft / fm, bm, bt, bm * fpt * 1e-9 / peak
    exit bad }'
