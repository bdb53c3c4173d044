#!/usr/bin/env bash
# make bench-codecs: builds bench_codecs in the given build directory and runs it. Without a
# build directory (first argument, unless it is an option), it uses $BUILD_DIR or build-release,
# configured as a Release build without libtorch when missing. Extra arguments go to the
# benchmark (e.g. --mb 64 --reps 5 --threads 2). The last line of output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-release}"
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTARLING_BUILD_TESTS=OFF \
    -DSTARLING_BUILD_BENCH=ON -DSTARLING_WITH_TORCH=OFF -DSTARLING_SANITIZE=OFF >/dev/null
fi
cmake --build "$build" --target bench_codecs -j"${JOBS:-2}" >/dev/null
exec "$build/bin/bench_codecs" "$@"
