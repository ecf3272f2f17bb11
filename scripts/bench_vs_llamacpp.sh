#!/usr/bin/env bash
# Myriad against llama.cpp on the same weights, in one run: prefill and decode tokens/s of three
# checkpoints of 68-98M parameters in the Kimi K3, Kimi Linear and DeepSeek-V3 forms
# (bench/models/*/config.json, random weights written by Myriad, converted to GGUF by llama.cpp's
# own convert_hf_to_gguf.py), same threads, same prompts, alternating which engine goes first.
#
#   scripts/bench_vs_llamacpp.sh [MODEL ...]      # k3 kimi-linear deepseek-v3 (default: all)
#
# Environment: THREADS (2), REPS (2: each figure is the best of REPS runs), QUICK=1 (short
# contexts: a smoke run of a few minutes), OUT (build/peers/bench), MYRIAD_BUILD (build/release,
# configured with --preset release when missing), FORMATS ("f32 bf16 q8_0 w8a8 q4_0").
#
# bf16: llama.cpp's converter writes bf16 weights, and Myriad loads the same f32 checkpoint as
# bf16 (bench_decode --bf16=1, the CLI's --dtype bf16: bf16 weights and activations, f32 sums).
# q8_0: llama.cpp's converter writes q8_0 weights (int8 codes, one f16 scale per 32 weights), and
# Myriad runs the same f32 checkpoint with weight-only int8 (bench_decode --quantize=8, the CLI's
# --quantize int8: int8 codes, one f32 scale per 32 weights; embedding, router and MLA's kv_b stay
# f32). w8a8: the same q8_0 GGUF's llama.cpp figures against Myriad's --quantize w8a8 (int8
# weights, and decode's products quantize their activations to int8 per 32 as llama.cpp's q8_0 dot
# product does; decode rows only, prefill being int8's). q4_0: the f32 GGUF rewritten by libllama's llama_model_quantize (tools/peers/
# llama_quantize.cpp; every weight q4_0, 4-bit codes with one f16 scale per 32), against Myriad's
# --quantize int4 (the same q4_0 rule, f32 scales). Rows: prefill of the short prompt, batch-1
# decode and 16 sequences at the short context. llama.cpp runs them without its CPU weight
# repacking (--no-repack): with it, this llama.cpp aborts on the q8_0 GGUFs of all three forms
# (GGML_ASSERT(*cur_backend_id != -1)).
# Its top-1 check against Myriad's f32 logits is printed, not enforced: on random weights a
# quantization error of either engine moves many top-1 tokens (docs/PERFORMANCE.md, int8).
#
# Before timing, each model is checked: llama.cpp's and Myriad's logits on the same 256 prompt
# positions (one prefill each) must give the same top-1 token at >= 95% of positions; the script
# stops otherwise. The configs set rms_norm_eps = 1e-6 because the engines differ in which eps
# two norms use (the KDA q/k l2 norm and the MLA q_a / kv_a RMSNorms: Myriad and fla fix 1e-6,
# llama.cpp takes rms_norm_eps); at 1e-6 the conventions coincide.
#
# Both engines: f32 weights (q8_0 rows: above), f32 caches (llama.cpp's KV cache type f32, flash
# attention off), greedy decoding, OMP_WAIT_POLICY unset. Figures:
#   prefill tokens/s of one 512- and 4096-token prompt (to its first token);
#   decode tokens/s at batch 1 after a 1024- and a 16384-token prompt;
#   decode tokens/s of 16 sequences after 1024-token prompts (llama.cpp: 16 parallel sequences
#   in one llama_decode per step; Myriad: 16 requests through the engine's continuous batching).
# Prints a table (Myriad / llama.cpp ratios) and writes it to OUT/table.md, the raw RESULT lines
# to OUT/results.tsv.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${THREADS:-2}"
REPS="${REPS:-2}"
OUT="${OUT:-$ROOT/build/peers/bench}"
MODELS=("$@")
FORMATS="${FORMATS:-f32 bf16 q8_0 w8a8 q4_0}"
(( ${#MODELS[@]} )) || MODELS=(k3 kimi-linear deepseek-v3)
if [[ "${QUICK:-0}" == 1 ]]; then
  P_SHORT=128 P_LONG=512 D_SHORT=256 D_LONG=1024 NEW=16
else
  P_SHORT=512 P_LONG=4096 D_SHORT=1024 D_LONG=16384 NEW=64
fi
log() { printf '[bench_vs_llamacpp] %s\n' "$*" >&2; }

# 1. Both engines built (each step is a no-op when up to date).
BUILD="${MYRIAD_BUILD:-$ROOT/build/release}"
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  "$ROOT/scripts/install-deps.sh"
  (cd "$ROOT" && cmake --preset release >/dev/null)
fi
cmake --build "$BUILD" -j "${MYRIAD_JOBS:-2}" --target bench_decode myriad >/dev/null
eval "$("$ROOT/scripts/peers/llama_cpp.sh" | grep -E '^[A-Z_0-9]+=')"
BENCH_DECODE="$BUILD/bench_decode"
MYRIAD="$BUILD/myriad"
PY="$LLAMA_CPP_PYTHON"

mkdir -p "$OUT"
RESULTS="$OUT/results.tsv"
: > "$RESULTS"
CHECKS="$OUT/checks.txt"
: > "$CHECKS"

# RESULT lines -> "engine model metric ctx value" rows.
record() {  # model, then the engine's output on stdin
  awk -v model="$1" '
    $1 == "RESULT" {
      engine = $2; metric = ""; ctx = ""; v = ""
      for (i = 3; i <= NF; ++i) {
        split($i, kv, "=")
        if ($i == "prefill") metric = "prefill"
        else if (kv[1] == "batch") metric = "decode_b" kv[2]
        else if (kv[1] == "ctx") ctx = kv[2]
        else if (kv[1] == "tokens_per_s") v = kv[2]
      }
      print engine "\t" model "\t" metric "\t" ctx "\t" v
    }' >> "$RESULTS"
}

# Myriad: bench_decode DIR (prefill of one prompt, batch 1, and optionally 16 sequences).
run_myriad() {  # label dir ctx new batch16 [bench_decode flag ...]
  OMP_NUM_THREADS="$THREADS" "$BENCH_DECODE" "$2" --ctx="$3" --new="$4" --batch16="$5" --show=0 \
    "${@:6}" | record "$1"
}
# llama.cpp: tools/peers/llama_speed.cpp (prefill of one prompt, then PARALLEL sequences).
run_llama() {  # label gguf ctx new parallel [extra flag]
  "$LLAMA_SPEED" "$2" --ctx "$3" --new "$4" --parallel "$5" --threads "$THREADS" --show 0 ${6:-} \
    2>/dev/null | record "$1"
}

for m in "${MODELS[@]}"; do
  cfg="$ROOT/bench/models/$m/config.json"
  [[ -f "$cfg" ]] || { log "no bench/models/$m/config.json"; exit 2; }
  dir="$OUT/$m"
  gguf="$OUT/$m.f32.gguf"
  # 2. Weights: random (seed 1), written by Myriad; rewritten when the config changed.
  if ! cmp -s "$cfg" "$dir/config.source.json"; then
    rm -rf "$dir" "$gguf"
    mkdir -p "$dir"
    cp "$cfg" "$dir/config.json"
    cp "$cfg" "$dir/config.source.json"
  fi
  if [[ ! -f "$dir/model.safetensors" ]]; then
    log "$m: writing random weights"
    OMP_NUM_THREADS="$THREADS" "$BENCH_DECODE" "$dir" --ctx=8 --new=1 --batch16=0 >/dev/null
  fi
  # 3. The same weights for llama.cpp, by its own converter (no vocabulary: token ids only).
  if [[ ! -f "$gguf" ]]; then
    log "$m: converting to GGUF (f32) with llama.cpp's convert_hf_to_gguf.py"
    PYTHONPATH="$LLAMA_CPP_DIR/gguf-py" "$PY" "$ROOT/tools/peers/convert_no_vocab.py" \
      "$LLAMA_CPP_DIR" "$dir" "$gguf" f32 > "$OUT/$m.convert.log" 2>&1 ||
      { tail -20 "$OUT/$m.convert.log"; exit 1; }
  fi
  # 4. Same computation? Top-1 over 256 prompt positions, one prefill each.
  V="$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('text_config', c)['vocab_size'])" "$cfg")"
  "$PY" "$ROOT/tools/peers/top1_agreement.py" --ids-out "$OUT/$m.ids.safetensors" --len 256 --vocab "$V"
  "$LLAMA_LOGITS" "$gguf" "$OUT/$m.ids.txt" "$OUT/$m.llama.safetensors" --threads "$THREADS" 2>/dev/null
  OMP_NUM_THREADS="$THREADS" "$MYRIAD" logits "$dir" --tokens "$OUT/$m.ids.safetensors" \
    --out "$OUT/$m.myriad.safetensors" >/dev/null
  agree="$("$PY" "$ROOT/tools/peers/top1_agreement.py" "$OUT/$m.myriad.safetensors" \
    "$OUT/$m.llama.safetensors" --min-agree 0.95)" || {
    log "$m: the engines disagree ($agree); not timing"
    exit 1
  }
  log "$m: $agree"
  echo "$m	$agree" >> "$CHECKS"
  # bf16 / q8_0 / q4_0: the same checkpoint in llama.cpp's format (bf16 and q8_0 by its converter,
  # q4_0 by llama_model_quantize from the f32 GGUF); top-1 against Myriad's f32 logits, printed.
  quant=()  # the formats llama.cpp runs on this model
  for f in bf16 q8_0 q4_0; do
    [[ " $FORMATS " == *" $f "* ]] || continue
    qg="$OUT/$m.$f.gguf"
    if [[ ! -f "$qg" ]]; then
      log "$m: writing the $f GGUF"
      if [[ $f != q4_0 ]]; then
        PYTHONPATH="$LLAMA_CPP_DIR/gguf-py" "$PY" "$ROOT/tools/peers/convert_no_vocab.py" \
          "$LLAMA_CPP_DIR" "$dir" "$qg" "$f" > "$OUT/$m.convert_$f.log" 2>&1 ||
          { tail -20 "$OUT/$m.convert_$f.log"; exit 1; }
      else
        "$LLAMA_QUANTIZE" "$gguf" "$qg" --threads "$THREADS" > "$OUT/$m.convert_$f.log" 2>&1 ||
          { tail -20 "$OUT/$m.convert_$f.log"; exit 1; }
      fi
    fi
    if "$LLAMA_LOGITS" "$qg" "$OUT/$m.ids.txt" "$OUT/$m.llama_$f.safetensors" \
      --threads "$THREADS" --no-repack > "$OUT/$m.llama_$f.log" 2>&1; then
      qagree="$("$PY" "$ROOT/tools/peers/top1_agreement.py" "$OUT/$m.myriad.safetensors" \
        "$OUT/$m.llama_$f.safetensors" --min-agree 0 || true)"
      log "$m $f vs Myriad f32 (not enforced): $qagree"
      echo "$m $f (llama.cpp) vs f32 (Myriad), informational	$qagree" >> "$CHECKS"
      quant+=("$f")
    else
      why="$(grep -m1 -E 'GGML_ASSERT|error' "$OUT/$m.llama_$f.log" || tail -1 "$OUT/$m.llama_$f.log")"
      log "$m: llama.cpp fails on its own $f weights ($why); no $f rows"
      echo "$m $f: llama.cpp fails on its own $f weights: $why" >> "$CHECKS"
    fi
  done
  # 5. Timings, alternating which engine goes first.
  for ((rep = 0; rep < REPS; ++rep)); do
    log "$m: round $((rep + 1))/$REPS"
    order=(myriad llama)
    (( rep % 2 )) && order=(llama myriad)
    for eng in "${order[@]}"; do
      if [[ $eng == myriad ]]; then
        if [[ " $FORMATS " == *" f32 "* ]]; then
          run_myriad "$m/f32" "$dir" "$P_SHORT" 8 0
          run_myriad "$m/f32" "$dir" "$D_SHORT" "$NEW" 1
          run_myriad "$m/f32" "$dir" "$P_LONG" 8 0
          run_myriad "$m/f32" "$dir" "$D_LONG" "$((NEW / 2))" 0
        fi
        for f in "${quant[@]}"; do
          flag=--bf16=1
          [[ $f == q8_0 ]] && flag=--quantize=8
          [[ $f == q4_0 ]] && flag=--quantize=4
          run_myriad "$m/$f" "$dir" "$P_SHORT" 8 0 "$flag"
          run_myriad "$m/$f" "$dir" "$D_SHORT" "$NEW" 1 "$flag"
          if [[ $f == q8_0 && " $FORMATS " == *" w8a8 "* ]]; then
            run_myriad "$m/w8a8" "$dir" "$D_SHORT" "$NEW" 1 --quantize=8 --act=8
          fi
        done
      else
        if [[ " $FORMATS " == *" f32 "* ]]; then
          run_llama "$m/f32" "$gguf" "$P_SHORT" 8 1
          run_llama "$m/f32" "$gguf" "$D_SHORT" "$NEW" 1
          run_llama "$m/f32" "$gguf" "$D_SHORT" "$NEW" 16
          run_llama "$m/f32" "$gguf" "$P_LONG" 8 1
          run_llama "$m/f32" "$gguf" "$D_LONG" "$((NEW / 2))" 1
        fi
        for f in "${quant[@]}"; do
          run_llama "$m/$f" "$OUT/$m.$f.gguf" "$P_SHORT" 8 1 --no-repack
          run_llama "$m/$f" "$OUT/$m.$f.gguf" "$D_SHORT" "$NEW" 1 --no-repack
          run_llama "$m/$f" "$OUT/$m.$f.gguf" "$D_SHORT" "$NEW" 16 --no-repack
        done
      fi
    done
  done
done
labels=()
for m in "${MODELS[@]}"; do for f in $FORMATS; do labels+=("$m/$f"); done; done
# (w8a8 rows: Myriad's w8a8 against llama.cpp's q8_0)

# 6. The table: best of REPS for each engine, and the ratio.
{
  echo "Myriad vs llama.cpp ($FORMATS weights; f32 caches), $THREADS thread(s), best of $REPS; $(date -u +%F), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "| model | weights | figure | Myriad tok/s | llama.cpp tok/s | Myriad / llama.cpp |"
  echo "|---|---|---|---:|---:|---:|"
  awk -F'\t' -v ps="$P_SHORT" -v pl="$P_LONG" -v ds="$D_SHORT" -v dl="$D_LONG" '
    { k = $2 SUBSEP $3 SUBSEP $4; if ($5 > best[$1, k]) best[$1, k] = $5; models[$2] = 1 }
    function row(m, metric, ctx, label,   a, b) {
      lm = m; sub(/\/w8a8$/, "/q8_0", lm)
      a = best["myriad", m SUBSEP metric SUBSEP ctx]; b = best["llama.cpp", lm SUBSEP metric SUBSEP ctx]
      if (a == "" || b == "") return
      split(m, mf, "/")
      printf "| %s | %s | %s | %.1f | %.1f | %.2f |\n", mf[1], mf[2] == "q8_0" ? "q8_0 / int8" : mf[2] == "w8a8" ? "q8_0 / w8a8" : mf[2] == "q4_0" ? "q4_0 / int4" : mf[2], label, a, b, a / b
    }
    END {
      n = split(order, ms, " ")
      for (i = 1; i <= n; ++i) {
        m = ms[i]
        row(m, "prefill", ps, "prefill " ps)
        row(m, "prefill", pl, "prefill " pl)
        row(m, "decode_b1", ds, "decode, batch 1, ctx " ds)
        row(m, "decode_b1", dl, "decode, batch 1, ctx " dl)
        row(m, "decode_b16", ds, "decode, 16 sequences, ctx " ds)
      }
    }' order="${labels[*]}" "$RESULTS"
  echo
  echo "Same computation (top-1 over 256 prefill positions, max |d| / max |ref|, RMS relative):"
  sed 's/^/- /' "$CHECKS"
} | tee "$OUT/table.md"
