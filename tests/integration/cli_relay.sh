#!/usr/bin/env bash
# Circuit relay v2 across processes on loopback: `starling dht` relays by default, a
# `starling node --relay-via` holds a reservation and prints its /p2p-circuit address, and
# `starling ping` / `starling echo` reach that node through the relay.
set -euo pipefail
bin=$1
source "$(dirname "$0")/../../scripts/lib/run.sh"
st_init
st_dht "$bin" relay
relay=$st_addr
grep -q "^relay on" "$dir/relay.log" || { echo "relay service not on"; cat "$dir/relay.log"; exit 1; }
st_bg "$dir/node.log" "$bin" node --identity "$dir/b.key" --listen /ip4/127.0.0.1/tcp/0 \
  --relay-via "$relay" --addr-file "$dir/b.addrs"
st_wait_file "$dir/b.addrs" || { cat "$dir/node.log"; exit 1; }
circuit=$(grep -m1 p2p-circuit "$dir/b.addrs") || { echo "no circuit address"; cat "$dir/node.log"; exit 1; }
echo "relayed address: $circuit"
"$bin" ping "$circuit" --count 3 | tee "$dir/ping.txt"
[[ $(grep -c "rtt" "$dir/ping.txt") == 3 ]]
"$bin" echo "$circuit" --text "hello through the relay" | tee "$dir/echo.txt"
grep -q "echo: hello through the relay" "$dir/echo.txt"
echo "cli_relay: ok"
