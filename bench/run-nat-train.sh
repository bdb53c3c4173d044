#!/usr/bin/env bash
# The NAT training run's efficiency (root, netlab): the same four `starling train` peers and
# bootstrap node train Fashion-MNIST to the same epoch twice in one invocation, once with two
# of them behind NATs (drop: hole punching; random: relay only; tests/netlab/netlab_nat_train.sh)
# and once all on public addresses (the anchor). Prints both wall times, the ratio
# public/NAT (the issue's target: >= 0.8) and the load average beside each.
# Usage: bench/run-nat-train.sh [BUILD_DIR]   (EPOCHS=100 by default)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
export STARLING=$BUILD/bin/starling
run() {  # label env...
  local label=$1 out
  shift
  out=$(env "$@" bash "$SRC/tests/netlab/netlab_nat_train.sh" 2>&1) || {
    echo "$out" | tail -20
    echo "run-nat-train: the $label run failed" >&2
    exit 1
  }
  echo "$out" | grep -E "^# (p2|n4|n5|n6):|figures|dcutr:|groups" | sed "s/^# /$label: /"
  echo "$out" | sed -nE 's/^# figures: [0-9]+ epochs in ([0-9.]+) s wall.*/\1/p' >"/tmp/run-nat-train.$label"
}
run nat NAT_TRAIN_PUBLIC=0
run public NAT_TRAIN_PUBLIC=1
nat=$(cat /tmp/run-nat-train.nat) pub=$(cat /tmp/run-nat-train.public)
rm -f /tmp/run-nat-train.nat /tmp/run-nat-train.public
awk -v n="$nat" -v p="$pub" 'BEGIN{printf "efficiency of the NAT run: public %.1f s / NAT %.1f s = %.2f (target >= 0.8)\n", p, n, p / n}'
