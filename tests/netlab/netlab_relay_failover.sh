#!/usr/bin/env bash
# Relay failover (root): public relays R1 (h1), R2 and R3 (h2, two processes); B behind a NAT
# (h3) wants one reservation among them and takes it with R1. R1 is SIGKILLed (no goodbye): B
# notices the connection is gone, reserves with R2 and announces the new /p2p-circuit address;
# A (behind another NAT, h4) then reaches B through R2. Then R2 goes silent without a reset
# (SIGSTOP: its kernel still ACKs, nothing answers): B's relay probe (a ping every 10 s, 5 s to
# answer) closes the connection and B reserves with R3 well before yamux keepalive (~40 s)
# would have noticed. The relay is never a required single point.
source "$(dirname "$0")/lib.sh"
STARLING=${STARLING:-$T_SRC/build/bin/starling}
need_root --nat
need_bins "$STARLING"

addr_of() { sed -nE "s|^listening on (/ip4/10\\.77\\.1\\.$2/tcp/4001/p2p/.*)\$|\\1|p" "$T_TMP/$1.log"; }

up --hosts 4 --nat 2
starling_node r1 h1 -l /ip4/0.0.0.0/tcp/4001 --relay
starling_node r2 h2 -l /ip4/0.0.0.0/tcp/4001 --relay
starling_node r3 h2 -l /ip4/0.0.0.0/tcp/4002 --relay
check "R1 is up" wait_for_line "$T_TMP/r1.log" '^listening on /ip4/10\.77\.1\.1/tcp/4001/' 10
check "R2 is up" wait_for_line "$T_TMP/r2.log" '^listening on /ip4/10\.77\.1\.2/tcp/4001/' 10
check "R3 is up" wait_for_line "$T_TMP/r3.log" '^listening on /ip4/10\.77\.1\.2/tcp/4002/' 10
r1=$(addr_of r1 1) r2=$(addr_of r2 2)
r3=$(sed -nE 's|^listening on (/ip4/10\.77\.1\.2/tcp/4002/p2p/.*)$|\1|p' "$T_TMP/r3.log")
r1_id=$(node_peer_id r1) r2_id=$(node_peer_id r2) r3_id=$(node_peer_id r3)

starling_node b h3 -l /ip4/0.0.0.0/tcp/4003 --relay-via "$r1" --relay-via "$r2" \
  --relay-via "$r3" --reservations 1
check "B holds one reservation, with R1" \
  wait_for_line "$T_TMP/b.log" "^relayed at $r1/p2p-circuit/p2p/" 20
check "... and none with R2" bash -c "! grep -q '^relayed at $r2' '$T_TMP/b.log'"
b_id=$(node_peer_id b)

since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}'; }
declare -A ID=([r1]=$r1_id [r2]=$r2_id [r3]=$r3_id)
# failover SIGNAL FROM TO WHAT PATTERN: signals relay FROM; B must log PATTERN about it (WHAT
# it noticed) and reserve with TO; sets $moved (seconds from the signal to the new reservation).
failover() {
  local sig=$1 from=$2 to=$3 what=$4 pattern=$5 t0 lost
  t0=$(date +%s.%N)
  kill "-$sig" "${NODE_PID[$from]}"
  check "B noticed $what" wait_for_line "$T_TMP/b.log" "relay [^ ]*${ID[$from]: -6}: $pattern" 60
  lost=$(since "$t0")
  check "B reserved with ${to^^} instead" \
    wait_for_line "$T_TMP/b.log" "relay [^ ]*${ID[$to]: -6}: reservation until" 30
  moved=$(since "$t0")
  note "after the SIG$sig: ${from^^} dropped in $lost s, new reservation with ${to^^} at $moved s" \
    "(load $(cut -d' ' -f1 /proc/loadavg))"
}
failover KILL r1 r2 "R1's connection was lost" "connection lost"

starling_node a h4 -l /ip4/0.0.0.0/tcp/0 --connect "$r2/p2p-circuit/p2p/$b_id"
check "A reaches B through R2" \
  wait_for_line "$T_TMP/a.log" "^connection $b_id relayed outbound /ip4/10\\.77\\.1\\.2/" 20
check "B accepted it through R2" \
  wait_for_line "$T_TMP/b.log" "^connection $(node_peer_id a) relayed inbound" 10

# R2 goes silent: no FIN, no RST (the process is frozen; its kernel keeps the connections).
failover STOP r2 r3 "R2 silent (its probe went unanswered)" "no answer to a ping"
# Yamux keepalive alone takes 30 s of silence, then 10 s for the probe's answer.
check "... within 25 s of the silence (yamux keepalive alone: ~40 s)" between "$moved" 0 25
kill -KILL "${NODE_PID[r2]}" 2>/dev/null || true
finish
