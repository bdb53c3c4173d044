#!/usr/bin/env bash
# make bench-moe-convergence: builds bench_moe_convergence in the given build directory
# (default: build, the release preset, which has libtorch) and runs it: the Fashion-MNIST DMoE
# model trained at equal samples locally (the anchor) and through expert servers over loopback,
# with 10% of expert calls failing, and with 1 server of 4 stopped halfway. Extra arguments go
# to the benchmark (e.g. --steps 3000). The last line of output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"  # the first argument, unless it is an option for the benchmark
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
[[ -f "$build/build.ninja" ]] || cmake --preset release -S "$root" -B "$build" >/dev/null
cmake --build "$build" --target bench_moe_convergence -j"${JOBS:-2}" >/dev/null
echo "load: $(uptime)"
"$build/bin/bench_moe_convergence" "$@"
echo "load: $(uptime)"
