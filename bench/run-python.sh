#!/usr/bin/env bash
# make bench-python (bench/run-python.sh): samples/s of the Python example (examples/python/fashion_mnist.py,
# starling.Optimizer around torch.optim.Adam) against `starling train` (the C++ Optimizer) on
# the same task (Fashion-MNIST MLP), the same number of peers on loopback, the same flags,
# one after the other on the same machine. Prints both figures and the ratio.
set -euo pipefail
build=${1:-build}
peers=${PEERS:-2}
seconds=${SECONDS_PER_RUN:-40}
py=${STARLING_TORCH_PYTHON:-/usr/bin/python3}
bin=$build/bin/starling
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap_node.sh"
start_bootstrap "$bin" "$dir"
common=(--target-batch-size 1024 --batch-size 64)  # both: Adam lr 0.001 (the defaults)
echo "== load before: $(uptime)"

run() {  # run NAME: $peers trainers for $seconds; prints the summed samples/s
  local name=$1 i ps=()
  for i in $(seq "$peers"); do
    if [[ $name == cpp ]]; then
      STARLING_LOG=warn "$bin" train --identity "$dir/c$i.key" --initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 \
        --run-id bench-cpp "${common[@]}" --threads 1 --max-seconds "$seconds" --linger 0 --report "$dir/$name$i.json" > "$dir/$name$i.log" 2>&1 &
    else
      STARLING_LOG=warn PYTHONPATH=$build/python OMP_NUM_THREADS=1 "$py" examples/python/fashion_mnist.py --initial-peers "$boot" \
        --run-id bench-py "${common[@]}" --max-seconds "$seconds" --epochs 1000000000 --linger 0 --seed "$i" > "$dir/$name$i.log" 2>&1 &
    fi
    ps+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || { echo "$name trainer failed:"; cat "$dir/$name"*.log; exit 1; }; done
}
cpp_rate() {  # samples / seconds of each `starling train --report`, summed
  "$py" - "$dir"/cpp*.json <<'PY'
import json, sys
rs = [json.load(open(f)) for f in sys.argv[1:]]
print("  C++ epochs", [r["epoch"] for r in rs], "test accuracy",
      [round(r["test_accuracy"], 4) for r in rs], file=sys.stderr)
print("%.1f" % sum(r["samples"] / r["seconds"] for r in rs))
PY
}
py_rate() {  # the example's final "samples_per_second X", summed
  grep -h '^done:' "$dir"/py*.log | sed 's/^/  Python /' >&2
  grep -h '^done:' "$dir"/py*.log | grep -oE 'samples_per_second [0-9.]+' | awk '{s += $2} END {printf "%.1f", s}'
}
run cpp
cpp=$(cpp_rate)
run py
pyr=$(py_rate)
echo "== load after: $(uptime)"
echo "C++ starling train: $peers peers, $cpp samples/s (sum)"
echo "Python starling.Optimizer: $peers peers, $pyr samples/s (sum)"
awk -v a="$pyr" -v b="$cpp" 'BEGIN {printf "ratio Python / C++: %.3f\n", a / b}'
