#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.cpp) with clang + ASan/UBSan in build/fuzz and
# runs each for MYRIAD_FUZZ_SECONDS (default 60) on a copy of its seed corpus
# (tests/fuzz/corpus/<name>/). Crashes are written to build/fuzz/crashes/<name>/; the script
# fails if any target crashes. Usage: scripts/fuzz.sh [target...]   (default: all)
# Needs clang and its compiler-rt (Debian: clang, libclang-rt-dev) and libomp-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${MYRIAD_FUZZ_SECONDS:-60}
jobs=${MYRIAD_JOBS:-2}
build=build/fuzz

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" -DMYRIAD_FUZZ=ON -DMYRIAD_CUDA=OFF \
  -DMYRIAD_BENCH=OFF ${MYRIAD_FUZZ_CMAKE_ARGS:-} >/dev/null
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

status=0
for t in "${targets[@]}"; do
  name=${t#fuzz_}
  corpus=$build/corpus/$name crashes=$build/crashes/$name
  mkdir -p "$corpus" "$crashes"
  cp -n tests/fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null || true
  echo "== $t: ${seconds}s =="
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$build/$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$corpus" 2>"$build/$t.log"; then
    echo "$t FAILED; see $build/$t.log and $crashes/"
    tail -n 40 "$build/$t.log"
    status=1
  else
    grep -E "^(stat::number_of_executed_units|stat::new_units_added|Done)" "$build/$t.log" || true
  fi
done
exit $status
