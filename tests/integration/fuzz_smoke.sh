#!/usr/bin/env bash
# Builds every libFuzzer target with clang 16 (ASan + UBSan, -O1 with line tables and assertions
# on, as libFuzzer recommends) and runs each for a bounded time.
# Usage: fuzz_smoke.sh SOURCE_DIR FUZZ_BUILD_DIR SECONDS_PER_TARGET
set -euo pipefail
src=$1 build=$2 secs=$3
if ! command -v clang++-16 > /dev/null; then echo "SKIP: clang++-16 not installed"; exit 77; fi
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" -DSTARLING_FUZZ=ON -DSTARLING_BUILD_TESTS=OFF \
  -DSTARLING_BUILD_BENCH=OFF -DSTARLING_WITH_TORCH=OFF > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" > "$build.build.log" 2>&1 || { tail -50 "$build.build.log"; exit 1; }
# One fuzzer per core at a time (each is single-threaded); results are printed in a fixed order.
run_one() {
  local f=$1 name corpus seeds
  name=$(basename "$f")
  corpus="$build/corpus/$name"
  mkdir -p "$corpus"
  seeds="$src/fuzz/corpus/$name"
  local args=("$corpus")
  [[ -d $seeds ]] && args+=("$seeds")
  if "$f" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      "${args[@]}" > "$build/$name.log" 2>&1; then
    echo "$name: ok ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$build/$name.log" | grep -o '[0-9]*$') runs)" > "$build/$name.result"
  else
    { echo "$name: FAILED"; tail -40 "$build/$name.log"; } > "$build/$name.result"
  fi
}
jobs_max=$(nproc)
targets=("$build"/bin/fuzz_*)
for f in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs_max)); do wait -n || true; done
  rm -f "$build/$(basename "$f").result"
  run_one "$f" &
done
wait
status=0
for f in "${targets[@]}"; do
  r="$build/$(basename "$f").result"
  if [[ -f $r ]]; then cat "$r"; else echo "$(basename "$f"): FAILED (no result)"; status=1; fi
  grep -q ': FAILED' "$r" 2>/dev/null && status=1
done
exit $status
