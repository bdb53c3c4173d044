#!/usr/bin/env bash
# make bench-python (bench/run-python.sh): samples/s of the Python example (examples/python/fashion_mnist.py,
# starling.Optimizer around torch.optim.Adam) against `starling train` (the C++ Optimizer) on
# the same task (Fashion-MNIST MLP), PEERS peers (default 4) on loopback, the same flags:
# (1) C++ peers alone in a run, (2) Python peers alone in a run, one after the other, and
# (3) PEERS C++ and PEERS Python peers in ONE run (the same rounds and load for both: the
# fairest comparison). Then the wrapper's own per-step cost (bench/python_step.py). Prints
# the figures and the ratios.
set -euo pipefail
build=${1:-build}
peers=${PEERS:-4}
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

start_cpp() {  # start_cpp NAME RUN_ID: $peers `starling train` peers
  local i
  for i in $(seq "$peers"); do
    STARLING_LOG=warn "$bin" train --identity "$dir/c$i.key" --initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 \
      --run-id "$2" "${common[@]}" --threads 1 --max-seconds "$seconds" --linger 0 --report "$dir/$1$i.json" > "$dir/$1$i.log" 2>&1 &
    ps+=($!)
  done
}
start_py() {  # start_py NAME RUN_ID: $peers Python peers
  local i
  for i in $(seq "$peers"); do
    STARLING_LOG=warn PYTHONPATH=$build/python OMP_NUM_THREADS=1 "$py" examples/python/fashion_mnist.py --initial-peers "$boot" \
      --run-id "$2" "${common[@]}" --max-seconds "$seconds" --epochs 1000000000 --linger 0 --seed "$i" > "$dir/$1$i.log" 2>&1 &
    ps+=($!)
  done
}
wait_all() {
  for p in "${ps[@]}"; do wait "$p" || { echo "a trainer failed:"; tail -5 "$dir"/*.log; exit 1; }; done
  ps=()
}
run() {  # run cpp|py|mix
  ps=()
  echo "== $1: load before $(uptime | sed 's/.*average: //')" >&2
  case $1 in
    cpp) start_cpp cpp bench-cpp ;;
    py) start_py py bench-py ;;
    mix) start_cpp mixc bench-mix; start_py mixp bench-mix ;;
  esac
  wait_all
  echo "== $1: load after $(uptime | sed 's/.*average: //')" >&2
}
cpp_rate() {  # cpp_rate PREFIX: samples / seconds of each `starling train --report`, summed
  "$py" - "$dir"/"$1"*.json <<'PY'
import json, sys
rs = [json.load(open(f)) for f in sys.argv[1:]]
print("  C++ epochs", [r["epoch"] for r in rs], "test accuracy",
      [round(r["test_accuracy"], 4) for r in rs], file=sys.stderr)
print("%.1f" % sum(r["samples"] / r["seconds"] for r in rs))
PY
}
py_rate() {  # py_rate PREFIX: the example's final "samples_per_second X", summed
  grep -h '^done:' "$dir"/"$1"*.log | sed 's/^/  Python /' >&2
  grep -h '^done:' "$dir"/"$1"*.log | grep -oE 'samples_per_second [0-9.]+' | awk '{s += $2} END {printf "%.1f", s}'
}
run cpp
cpp=$(cpp_rate cpp)
run py
pyr=$(py_rate py)
run mix
mixc=$(cpp_rate mixc)
mixp=$(py_rate mixp)
echo "C++ starling train: $peers peers, $cpp samples/s (sum)"
echo "Python starling.Optimizer: $peers peers, $pyr samples/s (sum)"
awk -v a="$pyr" -v b="$cpp" 'BEGIN {printf "ratio Python / C++ (separate runs): %.3f\n", a / b}'
echo "one run of $peers C++ + $peers Python peers: C++ $mixc samples/s, Python $mixp samples/s (sums)"
awk -v a="$mixp" -v b="$mixc" 'BEGIN {printf "ratio Python / C++ (same run): %.3f\n", a / b}'
# The Python wrapper's own cost per step() call (bench/python_step.py), one peer alone.
PYTHONPATH=$build/python OMP_NUM_THREADS=1 STARLING_LOG=warn "$py" "$(dirname "${BASH_SOURCE[0]}")/python_step.py" "$build/python" 3000
