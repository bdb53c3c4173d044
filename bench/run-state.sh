#!/usr/bin/env bash
# make bench-state: builds bench_state_format in the given build directory (default: build, the
# release preset, which has libtorch) and runs it: the training state's size and serialise /
# parse time in Starling's state format beside the torch archive (the anchor). Extra arguments
# go to the benchmark (e.g. --reps 41). The last line of output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"  # the first argument, unless it is an option for the benchmark
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
[[ -f "$build/build.ninja" ]] || cmake --preset release -S "$root" -B "$build" >/dev/null
cmake --build "$build" --target bench_state_format -j"${JOBS:-2}" >/dev/null
exec "$build/bin/bench_state_format" "$@"
