#!/usr/bin/env bash
# A NATed host can dial out (and appears with its router's outside address) but cannot be
# dialed: not at its inside address, not at the router's address, not even by a host that adds
# a route to the inside network through the router. Nothing in a run routes to the real outside.
source "$(dirname "$0")/lib.sh"
need_cmd iperf3 timeout
need_root --nat

up --hosts 3 --nat 1
h3_in=$(nl addr h3)
h3_out=$(nl addr h3 --outside)
h1=$(nl addr h1)
note "h1=$h1 h3 inside=$h3_in outside=$h3_out"
check "h3 has a private inside address" test "${h3_in%.*}" = "10.78.3"
check "h3's outside address differs (NAT router)" test "$h3_in" != "$h3_out"

bg_on h1 "$T_TMP/iperf-h1.log" iperf3 -s -p 5201 --forceflush
bg_on h3 "$T_TMP/iperf-h3.log" iperf3 -s -p 5202 --forceflush
wait_listen h1 5201
wait_listen h3 5202

# tcp_connect HOST ADDR PORT: succeeds if a TCP connection opens within 2 s
tcp_connect() {
  nl exec "$1" -- timeout 2 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null
}
cannot_connect() { ! tcp_connect "$@"; }
quiet() { "$@" >"$T_TMP/quiet.log" 2>&1 || { cat "$T_TMP/quiet.log"; return 1; }; }

# Dial out: an iperf3 transfer from the NATed host to a public host.
check "NATed h3 dials out to h1 (iperf3)" \
  quiet nl exec h3 -- timeout 15 iperf3 -c "$h1" -p 5201 -t 1 -f m
check "h1 saw the connection from h3's router address $h3_out" \
  wait_for_line "$T_TMP/iperf-h1.log" "Accepted connection from $h3_out" 5
check "public h2 dials h1 (control)" tcp_connect h2 "$h1" 5201
check "h3's listener answers on its inside address (from h3)" tcp_connect h3 "$h3_in" 5202

# Dial in: every way fails.
check "h1 cannot dial h3's inside address" cannot_connect h1 "$h3_in" 5202
check "h1 cannot dial h3 at its router's outside address" cannot_connect h1 "$h3_out" 5202
nl exec h1 -- ip route add 10.78.3.0/24 via "$h3_out"
check "h1 cannot dial h3 even with a route via the router (FORWARD drops new inbound)" \
  cannot_connect h1 "$h3_in" 5202

# Nothing routes to the real outside (192.0.2.1 is TEST-NET-1; `ip route get` only consults
# the routing table). h3's default route leads to r3, which has none.
no_route() { ! ip -n "$1" route get 192.0.2.1 >/dev/null 2>&1; }
for h in h1 h2 r3 net; do
  check "$h has no route to the outside world" no_route "$(nl ns "$h")"
done
check "h3's only way out is its NAT router" \
  bash -c "ip -n '$(nl ns h3)' route get 192.0.2.1 | grep -q 'via 10.78.3.1'"
finish
