#!/usr/bin/env bash
# make bench-moe-chain: builds bench_moe_chain in the given build directory (default: build,
# the release preset, which has libtorch) and runs it: latency hiding over a chain of 16
# expert blocks on 2 servers with an injected per-hop delay L * Exp(1), 1 trainer against 32
# concurrent trainers for each L, beside the chain run in-process (the anchor). Extra
# arguments go to the benchmark (e.g. --steps 4). The last line of output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"  # the first argument, unless it is an option for the benchmark
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
[[ -f "$build/build.ninja" ]] || cmake --preset release -S "$root" -B "$build" >/dev/null
cmake --build "$build" --target bench_moe_chain -j"${JOBS:-2}" >/dev/null
exec "$build/bin/bench_moe_chain" "$@"
