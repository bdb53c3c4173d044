#!/usr/bin/env bash
# make bench-training: builds bench_training in the given build directory (default: build,
# the release preset, which has libtorch) and runs it. Extra arguments go to the benchmark
# (e.g. --seconds 10 --peers 1,2,4), then again with delayed updates (4 peers), then
# bench/time_to_accuracy.sh (time to test accuracy 0.85: 4 processes per mode vs one alone,
# TTA_DEADLINE seconds at most per run), then bench/training_net.sh (4 `starling train`
# processes collaborating vs alone, NET_SECONDS each). The last line of output is
# `RESULT {json}` (training_net's; time_to_accuracy prints its own RESULT line before).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"  # the first argument, unless it is an option for the benchmark
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
[[ -f "$build/build.ninja" ]] || cmake --preset release -S "$root" -B "$build" >/dev/null
cmake --build "$build" --target bench_training starling_cli -j"${JOBS:-2}" >/dev/null
"$build/bin/bench_training" "$@"
# The same with delayed parameter updates (4 peers).
"$build/bin/bench_training" --peers 4 "$@" --delay
# Time to accuracy per mode, then samples/s of real processes over the network (its RESULT
# line ends the output).
"$root/bench/time_to_accuracy.sh" "$build/bin/starling" "${TTA_DEADLINE:-120}"
exec "$root/bench/training_net.sh" "$build/bin/starling" "${NET_SECONDS:-45}"
