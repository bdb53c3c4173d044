#!/usr/bin/env bash
# make bench-moe: builds bench_moe in the given build directory (default: build, the release
# preset, which has libtorch) and runs it: a RemoteExpert over loopback beside the same expert
# run locally (the anchor), and the server's batching under 64 concurrent requests. Extra
# arguments go to the benchmark (e.g. --reps 1000). The last line of output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"  # the first argument, unless it is an option for the benchmark
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
[[ -f "$build/build.ninja" ]] || cmake --preset release -S "$root" -B "$build" >/dev/null
cmake --build "$build" --target bench_moe -j"${JOBS:-2}" >/dev/null
exec "$build/bin/bench_moe" "$@"
