#!/usr/bin/env bash
# Circuit relay v2 interop with js-libp2p (@libp2p/circuit-relay-v2 from npm), on loopback:
#  1. a js-libp2p relay carries a connection between two Starling peers: `starling node
#     --relay-via <js relay>` holds a reservation (voucher verified), `starling ping` and
#     `starling echo` reach it through its /p2p-circuit address;
#  2. a js-libp2p peer holds a reservation with a Starling relay (`starling dht`), and
#     `starling ping` reaches the js peer through it (identify + ping over the relay).
# Exit 77 (skip) when node/npm or the npm packages are unavailable.
set -euo pipefail
src=$1 build=$2
bin=$build/bin/starling
jsdir=$("$src/tests/interop/setup.sh" "$build" | tail -1) || exit $?
source "$(dirname "$0")/../../scripts/lib/run.sh"
st_init
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "--- $f"; tail -30 "$f"; done; exit 1; }
wait_json() { for _ in $(seq 300); do [[ -s $1 ]] && return 0; sleep 0.1; done; return 1; }

# 1. js relay, Starling on both ends.
(cd "$jsdir" && exec node --import ./polyfill.mjs relay.mjs relay > "$dir/js-relay.json" \
  2> "$dir/js-relay.log") & pids+=($!)
wait_json "$dir/js-relay.json" || fail "js relay did not start"
relay=$(jq -r '.addrs[0]' "$dir/js-relay.json")
echo "js relay at $relay"
st_bg "$dir/node.log" "$bin" node --identity "$dir/b.key" --listen /ip4/127.0.0.1/tcp/0 \
  --relay-via "$relay" --addr-file "$dir/b.addrs"
st_wait_file "$dir/b.addrs" || fail "starling node did not start"
circuit=$(grep -m1 p2p-circuit "$dir/b.addrs") || fail "no reservation with the js relay"
echo "starling peer relayed at $circuit"
"$bin" ping "$circuit" --count 3 > "$dir/ping1.log" 2>&1 || fail "ping through the js relay"
cat "$dir/ping1.log"
[[ $(grep -c rtt "$dir/ping1.log") == 3 ]] || fail "ping count"
"$bin" echo "$circuit" --text "through js" > "$dir/echo1.log" 2>&1 || fail "echo through the js relay"
grep -q "echo: through js" "$dir/echo1.log" || fail "echo reply"

# 2. Starling relay, js peer behind it.
st_dht "$bin" srelay || fail "starling dht did not start"
srelay=$st_addr
(cd "$jsdir" && exec node --import ./polyfill.mjs relay.mjs reserve "$srelay" > "$dir/js-b.json" \
  2> "$dir/js-b.log") & pids+=($!)
wait_json "$dir/js-b.json" || fail "js peer did not report"
jscircuit=$(jq -r '.circuit[0] // empty' "$dir/js-b.json")
[[ -n $jscircuit ]] || fail "js peer got no reservation from the starling relay"
echo "js peer relayed at $jscircuit"
"$bin" ping "$jscircuit" --count 3 > "$dir/ping2.log" 2>&1 || fail "ping js through the starling relay"
cat "$dir/ping2.log"
grep -q "identify: agent js-libp2p" "$dir/ping2.log" || fail "identify of the js peer"
[[ $(grep -c rtt "$dir/ping2.log") == 3 ]] || fail "ping count"
echo "interop_relay: ok"
