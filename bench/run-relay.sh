#!/usr/bin/env bash
# make bench-relay: a connection through a Starling circuit relay v2 beside the direct
# connection between the same hosts, same run (loopback, one io thread per host). Builds
# bench_relay in the given build directory (first argument; default build), configured when
# missing. The last line of output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTARLING_BUILD_TESTS=OFF \
    -DSTARLING_BUILD_BENCH=ON -DSTARLING_WITH_TORCH=OFF -DSTARLING_SANITIZE=OFF >/dev/null
fi
cmake --build "$build" --target bench_relay -j"${JOBS:-2}" >/dev/null
exec "$build/bin/bench_relay" --tries "${BENCH_TRIES:-20}" --pings "${BENCH_PINGS:-50}" \
  --reps "${BENCH_REPS:-5}" --mib "${BENCH_MIB:-16}"
