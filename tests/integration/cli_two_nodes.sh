#!/usr/bin/env bash
# Two processes on loopback: `starling node` serves, `starling ping` and `starling echo` dial it.
set -euo pipefail
bin=$1
source "$(dirname "$0")/../../scripts/lib/run.sh"
st_init
"$bin" id --identity "$dir/a.key" > "$dir/id.txt"
perm=$(stat -c %a "$dir/a.key")
[[ $perm == 600 ]] || { echo "identity file mode is $perm, want 600"; exit 1; }
st_bg "$dir/node.log" "$bin" node --identity "$dir/a.key" --listen /ip4/127.0.0.1/tcp/0 \
  --addr-file "$dir/addrs"
node_pid=$st_pid
st_wait_file "$dir/addrs"
addr=$(head -1 "$dir/addrs")
[[ $addr == */p2p/$(cat "$dir/id.txt") ]] || { echo "bad address '$addr'"; cat "$dir/node.log"; exit 1; }
"$bin" ping "$addr" --count 3 | tee "$dir/ping.txt"
[[ $(grep -c "rtt" "$dir/ping.txt") == 3 ]]
"$bin" echo "$addr" --text "hello starling" | tee "$dir/echo.txt"
grep -q "echo: hello starling" "$dir/echo.txt"
"$bin" echo "$addr" --rpc --text "hello rpc" | tee "$dir/rpc.txt"
grep -q "echo: hello rpc" "$dir/rpc.txt"
# A malformed address is rejected with a reason, not a crash.
if "$bin" ping /ip4/999.1.1.1/tcp/1 2> "$dir/err.txt"; then echo "bad address accepted"; exit 1; fi
grep -qi "error" "$dir/err.txt"
# Graceful stop is bounded.
kill -INT "$node_pid"
for _ in $(seq 100); do kill -0 "$node_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$node_pid" 2>/dev/null; then echo "node did not stop within 10 s"; exit 1; fi
wait "$node_pid" || true
pids=()
grep -q stopped "$dir/node.log"
echo "cli_two_nodes: ok"
