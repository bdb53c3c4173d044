#!/usr/bin/env bash
# make bench-relay: a connection through a Starling circuit relay v2 beside the direct
# connection between the same hosts, same run (loopback, one io thread per host).
set -euo pipefail
build=${1:-build}
exec "$build/bin/bench_relay" --tries "${BENCH_TRIES:-20}" --pings "${BENCH_PINGS:-50}" \
  --reps "${BENCH_REPS:-3}" --mib "${BENCH_MIB:-16}"
