#!/usr/bin/env bash
# Interop with a real libp2p peer nobody here wrote (js-libp2p from npm), both directions:
#  1. js-libp2p listens; `starling ping` (identify + ping) and `starling echo` (10 MB on one
#     stream, then 8 concurrent streams) dial it.
#  2. `starling node` listens; the js peer dials it: ping, identify, 10 MB echo, 8 streams.
# Exit 77 (skip) when node/npm or the npm packages are unavailable.
set -euo pipefail
src=$1 build=$2
bin=$build/bin/starling
jsdir=$("$src/tests/interop/setup.sh" "$build" | tail -1) || exit $?
source "$(dirname "$0")/../../scripts/lib/run.sh"
st_init
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "--- $f"; tail -30 "$f"; done; exit 1; }

# 1. Starling dials js-libp2p.
(cd "$jsdir" && exec node --import ./polyfill.mjs peer.mjs listen --port 0 --host 127.0.0.1 --stdin ignore \
  --exit-after 300 > "$dir/js-listen.json" 2> "$dir/js-listen.log") & pids+=($!)
for _ in $(seq 300); do [[ -s $dir/js-listen.json ]] && break; sleep 0.1; done
[[ -s $dir/js-listen.json ]] || fail "js peer did not start"
jsaddr=$(jq -r '.addrs[0]' "$dir/js-listen.json")
echo "js-libp2p listening at $jsaddr"
"$bin" ping "$jsaddr" --count 3 > "$dir/ping.log" 2>&1 || fail "starling ping js"
cat "$dir/ping.log"
grep -q "identify: agent js-libp2p" "$dir/ping.log" || fail "identify of js peer"
[[ $(grep -c rtt "$dir/ping.log") == 3 ]] || fail "ping count"
"$bin" echo "$jsaddr" --bytes 10485760 --timeout 60 > "$dir/echo1.log" 2>&1 || fail "10 MB echo to js"
cat "$dir/echo1.log"
"$bin" echo "$jsaddr" --bytes 1048576 --streams 8 --timeout 60 > "$dir/echo8.log" 2>&1 || fail "8-stream echo to js"
cat "$dir/echo8.log"

# 2. js-libp2p dials Starling.
st_bg "$dir/node.log" "$bin" node --identity "$dir/node.key" --listen /ip4/127.0.0.1/tcp/0 \
  --addr-file "$dir/addrs"
st_wait_file "$dir/addrs" || fail "starling node did not start"
addr=$(head -1 "$dir/addrs")
(cd "$jsdir" && node --import ./polyfill.mjs peer.mjs dial "$addr" --echo-bytes 10485760 --streams 8 \
  --step-timeout 60 > "$dir/js-dial.json" 2> "$dir/js-dial.log") || fail "js dial: $(cat "$dir/js-dial.json")"
jq -c '{ok, ping_ms, agent: .identify.agentVersion, protocols: .identify.protocols, echo: .echo.sha256_match, concurrent: .concurrent.all_match}' "$dir/js-dial.json"
[[ $(jq -r '.ok and .echo.sha256_match and .concurrent.all_match' "$dir/js-dial.json") == true ]] || fail "js dial result"
[[ $(jq -r '.identify.agentVersion' "$dir/js-dial.json") == starling/* ]] || fail "identify of starling from js"
echo "interop_js: ok"
