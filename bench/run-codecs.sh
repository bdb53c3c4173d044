#!/usr/bin/env bash
# Builds bench_codecs in a Release build directory and runs it. Extra arguments go to the
# benchmark (e.g. --mb 64 --reps 5 --threads 2). The last line of output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-release}"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTARLING_BUILD_TESTS=OFF \
    -DSTARLING_BUILD_BENCH=ON -DSTARLING_WITH_TORCH=OFF -DSTARLING_SANITIZE=OFF >/dev/null
fi
ninja -C "$build" -j"${JOBS:-2}" bench_codecs >/dev/null
exec "$build/bin/bench_codecs" "$@"
