#!/usr/bin/env bash
# Greedy decode throughput, Myriad's inference engine against transformers' generate() on the
# CPU, side by side: same checkpoint, same prompts, same thread count.
#   Myriad: build/…/bench_decode DIR (bench/bench_decode.cpp): infer::Engine, f32, batch 1 and 16
#           concurrent requests, timed after every request has its first token.
#   PyTorch: tools/reference/bench_decode_torch.py DIR: KimiLinearForCausalLM.generate(), f32,
#            use_cache=True, greedy, timed from the first new token to the last (a streamer).
# The model is a plain kimi_linear config that both run identically (no K3 extensions): the
# config of scripts/bench_model.sh (hidden 256, 8 layers: 6 KDA + 2 MLA NoPE, 32 experts top-4 +
# 1 shared, vocab 8192, 30.0M parameters). bench_decode gives it random weights and saves them
# (config.json + model.safetensors); transformers loads that directory. Sequence b of a batch is
# the prompt 4 + (i * 7919 + b * 131) mod (V - 4), i < CTX, on both sides; EOS is ignored.
# Each side prints every sequence's first SHOW greedy tokens; the summary says how many of the
# sequences agree token for token.
# Runs alternate, Myriad / torch / Myriad / torch ..., so machine noise hits both; the load
# average is printed around each. Both sides run with OMP_WAIT_POLICY=PASSIVE: with spinning
# OpenMP threads on a loaded 2-core machine, torch's decode steps ran 30-100x slower.
# Settings (environment): OMP_NUM_THREADS (2), CTX (1024), NEW (64 new tokens per sequence),
# BATCH16 (1; 0 runs batch 1 only), ROUNDS (2), SHOW (8), MYRIAD_BUILD (build/release;
# bench_decode is built there when missing or older than its source), MYRIAD_BENCH_DIR (build/bench_decode_vs_torch: the
# model and logs), MYRIAD_REF_PYTHON (else the first of tools/reference/.venv, /work/.venv-ref,
# python3 that has transformers, else python3, with which the script creates
# tools/reference/.venv from requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
CTX=${CTX:-1024} NEW=${NEW:-64} BATCH16=${BATCH16:-1} ROUNDS=${ROUNDS:-2} SHOW=${SHOW:-8}
build=${MYRIAD_BUILD:-build/release}
dir=${MYRIAD_BENCH_DIR:-build/bench_decode_vs_torch}
mkdir -p "$dir/model"

py=${MYRIAD_REF_PYTHON:-}
for cand in tools/reference/.venv/bin/python /work/.venv-ref/bin/python python3; do
  [ -n "$py" ] && break
  if command -v "$cand" >/dev/null && "$cand" -c 'import transformers' 2>/dev/null; then py=$cand; fi
done
py=${py:-python3}

if [ ! -x "$build/bench_decode" ] || [ bench/bench_decode.cpp -nt "$build/bench_decode" ]; then
  echo "== building bench_decode in $build =="
  [ -f "$build/CMakeCache.txt" ] || cmake --preset release >/dev/null
  cmake --build "$build" -j "${MYRIAD_JOBS:-2}" --target bench_decode
fi

# The config, as in scripts/bench_model.sh but with room for long prompts. A changed config
# drops the old weights, so bench_decode writes new ones.
# shellcheck disable=SC2016  # the pattern matches a literal $dir
sed -n '/^cat >"\$dir\/config.json.new" <<.EOF.$/,/^EOF$/p' scripts/bench_model.sh | sed '1d;$d' |
  sed 's/"model_max_length": 4096/"model_max_length": 131072/' >"$dir/config.json"
grep -q '"model_type": "kimi_linear"' "$dir/config.json" || { echo "no config in scripts/bench_model.sh" >&2; exit 1; }
if ! cmp -s "$dir/config.json" "$dir/config.written"; then
  rm -f "$dir/model/model.safetensors"
  cp "$dir/config.json" "$dir/model/config.json"
  cp "$dir/config.json" "$dir/config.written"
fi

load() { cut -d' ' -f1-3 /proc/loadavg; }
batches=1
[ "$BATCH16" = 1 ] && batches=1,16
echo "== decode: CTX=$CTX, NEW=$NEW, batches $batches, OMP_NUM_THREADS=$OMP_NUM_THREADS" \
  "OMP_WAIT_POLICY=$OMP_WAIT_POLICY, $ROUNDS rounds =="
for ((r = 1; r <= ROUNDS; ++r)); do
  echo "-- round $r: Myriad (load $(load))"
  "$build/bench_decode" "$dir/model" --ctx="$CTX" --new="$NEW" --show="$SHOW" --batch16="$BATCH16" |
    tee "$dir/myriad.$r.log" | grep -v '^TOKENS'
  echo "-- round $r: torch (load $(load))"
  "$py" tools/reference/bench_decode_torch.py "$dir/model" --ctx "$CTX" --new "$NEW" --show "$SHOW" \
    --batches "$batches" 2>&1 | grep -v -e '^Loading weights' -e 'it/s]$' | tee "$dir/torch.$r.log" |
    grep -v '^TOKENS'
  echo "   (load after: $(load))"
done

echo
echo "== summary: CTX=$CTX, $NEW new tokens per sequence, $OMP_NUM_THREADS threads, tokens/s of decode steps =="
for ((r = 1; r <= ROUNDS; ++r)); do
  for side in myriad torch; do sed "s/^/$side $r /" "$dir/$side.$r.log"; done
done | awk -v rounds="$ROUNDS" '
  function f(s, k,   m) { return match(s, " " k "=[^ ]*") ? substr(s, RSTART + length(k) + 2, RLENGTH - length(k) - 2) : "" }
  $3 == "RESULT" { b = f($0, "batch"); rate[$1, $2, b] = f($0, "tokens_per_s"); cache[$1, b] = f($0, "cache_bytes_per_seq"); B[b] = 1 }
  $3 == "TOKENS" { key = $1 SUBSEP f($0, "batch") SUBSEP f($0, "seq") SUBSEP $2; sub(/.* seq=[0-9]+ /, ""); tok[key] = $0 }
  END {
    printf "  %-6s %-6s %12s %12s %8s\n", "batch", "round", "Myriad", "torch", "ratio"
    bad = 0
    nb = split("1 16", bs, " ")
    for (i = 1; i <= nb; ++i) {
      b = bs[i]
      if (!(b in B)) continue
      bm = bt = 0
      for (r = 1; r <= rounds; ++r) {
        m = rate["myriad", r, b] + 0; t = rate["torch", r, b] + 0
        printf "  %-6s %-6s %12.1f %12.1f %7.2fx\n", b, r, m, t, m / t
        if (m > bm) bm = m; if (t > bt) bt = t
      }
      same = n = 0
      for (k in tok) {
        split(k, p, SUBSEP)  # side, batch, seq, round
        if (p[1] != "myriad" || p[2] != b) continue
        ++n; if (tok["torch", p[2], p[3], p[4]] == tok[k]) ++same
      }
      if (same != n) bad = 1
      printf "  %-6s %-6s %12.1f %12.1f %7.2fx   greedy tokens: %d/%d sequence-rounds agree\n", b, "best", bm, bt, bm / bt, same, n
      printf "  %-6s cache bytes per sequence: Myriad %s (f32, prompt in whole 256-token pages), torch %s (prompt + new - 1 tokens)\n",
        b, cache["myriad", b], cache["torch", b]
      printf "RESULT batch=%s myriad_tokens_per_s=%.1f torch_tokens_per_s=%.1f ratio=%.3f tokens_agree=%d/%d\n", b, bm, bt, bm / bt, same, n
    }
    exit bad }'
