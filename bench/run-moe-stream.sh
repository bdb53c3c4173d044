#!/usr/bin/env bash
# make bench-moe-stream: builds bench_moe_stream in the given build directory (default: build,
# the release preset, which has libtorch) and runs it: a large expert call (forward + backward of
# a 24 MiB tensor) streamed beside the same call as one message (the anchor): throughput and
# peak memory. Extra arguments go to the benchmark (e.g. --reps 9). The last line of output is
# `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"  # the first argument, unless it is an option for the benchmark
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
[[ -f "$build/build.ninja" ]] || cmake --preset release -S "$root" -B "$build" >/dev/null
cmake --build "$build" --target bench_moe_stream -j"${JOBS:-2}" >/dev/null
exec "$build/bin/bench_moe_stream" "$@"
