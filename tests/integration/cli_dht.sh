#!/usr/bin/env bash
# Several `starling dht` processes on loopback: a bootstrap node and four more join through it;
# `starling dht put` through one node, `starling dht get` through another; one node is killed
# (SIGKILL) and the values are still there; Ctrl-C stops a node within a bounded time.
set -euo pipefail
bin=$1
source "$(dirname "$0")/../../scripts/lib/run.sh"
st_init

st_dht "$bin" boot
boot=$st_addr
[[ $boot == /ip4/127.0.0.1/tcp/*/p2p/12D3KooW* ]] || { echo "bad address '$boot'"; exit 1; }
for n in n1 n2 n3 n4; do st_dht "$bin" "$n" "$boot"; done
grep -q "routing table [1-9]" "$dir/n4.log" || { echo "n4 did not join"; cat "$dir/n4.log"; exit 1; }

n1=$(head -1 "$dir/n1.addr")
n3=$(head -1 "$dir/n3.addr")
t=(--timeout 30)
t_put=$(date +%s.%N)
"$bin" dht put greeting "hello dht" --ttl 600 -p "$n1" "${t[@]}" | tee "$dir/put.txt"
grep -q "stored greeting on [1-9]" "$dir/put.txt"
"$bin" dht put workers busy --subkey w1 -p "$n1" "${t[@]}" > /dev/null
"$bin" dht put workers idle --subkey w2 -p "$boot" "${t[@]}" > /dev/null

"$bin" dht get greeting -p "$n3" "${t[@]}" | tee "$dir/get.txt"
elapsed=$(awk -v a="$(date +%s.%N)" -v b="$t_put" 'BEGIN{print a - b}')
# The TTL left is 600 s minus the time since the put (not more, and at most a second less).
ttl_left=$(sed -nE 's/.*value "hello dht"  \(ttl ([0-9.]+).*/\1/p' "$dir/get.txt")
awk -v v="$ttl_left" -v e="$elapsed" 'BEGIN{exit !(v != "" && v <= 600 && v >= 600 - e - 1)}' ||
  { echo "ttl left '$ttl_left' not within [600 - $elapsed - 1, 600]"; exit 1; }
"$bin" dht get workers --latest -p "$n3" "${t[@]}" | tee "$dir/dict.txt"
grep -q "dictionary, 2 sub-keys" "$dir/dict.txt"
grep -q 'subkey "w1" = "busy"' "$dir/dict.txt"
grep -q 'subkey "w2" = "idle"' "$dir/dict.txt"

# A missing key: exit code 3 and a clear line.
set +e
"$bin" dht get no-such-key -p "$n3" "${t[@]}" > "$dir/missing.txt"
rc=$?
set -e
[[ $rc == 3 ]] || { echo "get of a missing key exited $rc"; exit 1; }
grep -q "not found: no-such-key" "$dir/missing.txt"

# Kill n1 (the node the values were put through) hard; the values live on elsewhere.
kill -9 "${pids[1]}"
wait "${pids[1]}" 2>/dev/null || true
"$bin" dht get greeting -p "$n3" "${t[@]}" | grep -q 'value "hello dht"'
"$bin" dht get workers --latest -p "$boot" "${t[@]}" | grep -q "dictionary, 2 sub-keys"

# No initial peer answers: a clear error, bounded.
set +e
"$bin" dht get greeting -p "${n1}" --timeout 30 2> "$dir/err.txt"
rc=$?
set -e
[[ $rc != 0 ]] || { echo "get through a dead node succeeded"; exit 1; }
grep -q "initial peers answered" "$dir/err.txt" || { cat "$dir/err.txt"; exit 1; }

# Ctrl-C stops a node within 10 s.
kill -INT "${pids[2]}"
for _ in $(seq 100); do kill -0 "${pids[2]}" 2>/dev/null || break; sleep 0.1; done
if kill -0 "${pids[2]}" 2>/dev/null; then echo "node did not stop within 10 s"; exit 1; fi
grep -q stopped "$dir/n2.log"
echo "cli_dht: ok"
