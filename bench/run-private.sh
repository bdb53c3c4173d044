#!/usr/bin/env bash
# make bench-private: what a private run costs (bench_private_run.cpp): membership checks beside
# a DHT record's signature check, and rounds of a private run beside an open run's, same process.
# Builds bench_private_run in the given build directory (first argument; default build),
# configured when missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTARLING_BUILD_TESTS=OFF \
    -DSTARLING_BUILD_BENCH=ON -DSTARLING_WITH_TORCH=OFF -DSTARLING_SANITIZE=OFF >/dev/null
fi
cmake --build "$build" --target bench_private_run -j"${JOBS:-2}" >/dev/null
exec "$build/bin/bench_private_run" "${BENCH_ROUNDS:-30}" "${BENCH_FLOATS:-1048576}"
