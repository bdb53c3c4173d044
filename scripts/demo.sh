#!/usr/bin/env bash
# make demo: the main job of the current build. Part 1: two nodes on loopback connect through
# the full libp2p stack (TCP, multistream-select, Noise XX, yamux), identify each other, ping,
# and echo over a protocol stream; every step is printed. Part 2: `starling train` on
# a collaboration on Fashion-MNIST (scripts/demo_train.sh): a DHT bootstrap node and 4
# trainers; one is SIGKILLed midway and a new one joins and catches up; >= 85% test accuracy,
# identical parameters on every live peer, the whole stage under 10 minutes.
set -euo pipefail
build=${1:-build}
bin=$build/bin/starling
dir=$(mktemp -d)
node_pid=""
cleanup() {
  local rc=$?
  [[ -n $node_pid ]] && kill "$node_pid" 2>/dev/null
  wait 2>/dev/null || true
  if ((rc == 0)); then rm -rf "$dir"; else echo "== logs of the failed run kept in $dir"; fi
}
trap cleanup EXIT

echo "== starting node A (identity $dir/a.key)"
"$bin" node --identity "$dir/a.key" --listen /ip4/127.0.0.1/tcp/0 --addr-file "$dir/addrs" > "$dir/a.log" 2>&1 &
node_pid=$!
for _ in $(seq 100); do [[ -s $dir/addrs ]] && break; sleep 0.1; done
[[ -s $dir/addrs ]] || { echo "node A did not start"; cat "$dir/a.log"; exit 1; }
addr=$(head -1 "$dir/addrs")
echo "   node A listens on $addr"
echo "== node B dials A, identifies it and pings it"
"$bin" ping "$addr" --count 5
echo "== node B echoes a message through /starling/echo/1.0.0"
"$bin" echo "$addr" --text "hello from node B"
echo "== node B calls the typed echo RPC (/starling/rpc/echo/1.0.0)"
"$bin" echo "$addr" --rpc --text "hello over RPC"
echo "== node B echoes 10 MB on 4 concurrent streams and checks every byte"
"$bin" echo "$addr" --bytes 10485760 --streams 4
echo "== stopping node A (bounded shutdown)"
kill -INT "$node_pid"; wait "$node_pid" || true; node_pid=""
sed 's/^/   A: /' "$dir/a.log"

if "$bin" train --help >/dev/null 2>&1; then
  scripts/demo_train.sh "$bin" "$dir"
else
  echo "== starling train: not built (no libtorch)"
fi
echo "== demo finished"
