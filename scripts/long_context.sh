#!/usr/bin/env bash
# The long-context experiment (docs/LONG_CONTEXT.md): does Myriad's CPU curriculum produce
# retrieval, and does a progressive curriculum beat training at the final length or only at the
# first one for the same tokens? Runs, two at a time with one thread each (a tiny model uses two
# single-threaded processes better than one with two threads):
#   progressive  256 -> 1K -> 4K            (configs/recipes/long-context/progressive.toml)
#   direct       every step at 4K           (direct.toml, same tokens)
#   short        every step at 256          (short.toml, same tokens)
#   kda, mla     the progressive curriculum with all-KDA and all-MLA layouts
#   progressive-long  80 steps at 1K and 100 at 4K (not budget-matched: how far more long-stage
#                steps carry the retrieval stage 0 learns)
# all on the §5.2 long mix with 45% retrieval items whose answers weigh 16 in the loss
# (answer_weight = 16),
# then evaluates each final model through the serving engine (passkey, MK-NIAH, VT at 256 .. 16K,
# held-out loss at each length on one shared held-out set, the induction probe), the progressive
# hybrid past its training length (32K .. 128K) with a full and a constant-memory sliding MLA
# cache, and writes the comparisons (compare.md / compare.html) into the output directory.
#   scripts/long_context.sh [OUT_DIR]        (about 100 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "${MYRIAD_JOBS:-2}" --target myriad
export OMP_WAIT_POLICY=PASSIVE
m=$PWD/build/release/myriad
out=${1:-runs/long-context-$(date +%Y%m%d-%H%M%S)}
recipes=configs/recipes/long-context
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "[$(( ($(date +%s) - start) / 60 )) min] $*"; }

# One tokenizer and base shards for every run: the first run builds them.
stamp "progressive (builds the shared tokenizer and shards first)"
OMP_NUM_THREADS=1 $m train $recipes/progressive.toml --out "$out/progressive" >"$out/progressive.log" 2>&1 &
first=$!
# Wait for the shared tokenizer and shards before starting the others.
while [[ ! -f "$out/shards/meta.json" ]] && kill -0 $first 2>/dev/null; do sleep 5; done
run() {  # run NAME: train recipes/NAME.toml into $out/NAME with one thread
  OMP_NUM_THREADS=1 $m train "$recipes/$1.toml" --out "$out/$1" >"$out/$1.log" 2>&1
  stamp "$1 done: $(grep -c 'gate' "$out/$1.log" || true) stage evals"
}
run direct
wait $first
stamp "progressive done"
# The last four together (4 processes on 2 cores keep both busy to the end), and the held-out set.
run short & run kda & run mla & run progressive-long &
# Shared held-out set: the §5.2 mix at 16K (documents, short documents, 20% retrieval items).
$m data build --tokenizer "$out/tokenizer.model" --out "$out/heldout" --stage-length 16384 \
  --prev-stage-length 4096 --stage-tokens 400000 --heldout 0.5 --synthetic 0.2 --seed 4242 >/dev/null
wait
stamp "training done; evaluating"
evaluate() {  # evaluate NAME
  OMP_NUM_THREADS=1 $m eval "$out/$1/model" --tasks passkey,mk_niah,vt \
    --lengths 256,1024,4096,16384 --seeds 4 --depths 0,0.5,1 --heldout "$out/heldout" \
    --loss-lengths 256,1024,4096,16384 --loss-tokens 65536 --induction 100 \
    --json "$out/$1/eval.json" >"$out/$1/eval.txt"
  stamp "eval $1: $(tr '\n' ' ' <"$out/$1/eval.txt")"
}
evaluate progressive & evaluate direct; wait
evaluate short & evaluate kda; wait
evaluate mla & evaluate progressive-long; wait
# Past the training length: the full paged MLA cache, then a 32 MiB budget that makes the MLA
# cache slide (constant memory; the KDA state is constant anyway).
for mode in full sliding; do
  flags=(--cache-budget 4G)
  [[ $mode == sliding ]] && flags=(--cache-budget 32M --sliding)
  OMP_NUM_THREADS=2 $m eval "$out/progressive/model" --tasks passkey --lengths 32768,65536,131072 \
    --seeds 1 --depths 0.5,1 "${flags[@]}" --json "$out/extrapolation-$mode.json" |
    tee "$out/extrapolation-$mode.txt"
done
$m report "$out/compare-curriculum" --title "Curriculum contrast at equal tokens" \
  --compare "progressive 256→1K→4K=$out/progressive" --compare "direct 4K=$out/direct" \
  --compare "short 256=$out/short"
$m report "$out/compare-layout" --title "Layout contrast (progressive curriculum)" \
  --compare "3:1 KDA:MLA hybrid=$out/progressive" --compare "all KDA=$out/kda" \
  --compare "all MLA=$out/mla"
stamp "done: $out/compare-curriculum/compare.html, $out/compare-layout/compare.html"
