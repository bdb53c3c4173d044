#!/usr/bin/env bash
# `netlab delay` puts a transparent delay proxy in a host: every TCP connection that host dials
# gets the configured one-way delay in both directions (RTT + 2 x delay), also from behind NAT;
# connections dialed by other hosts are untouched; --off restores the plain link; delay and a
# tbf cap combine. Expected values come from the configuration.
source "$(dirname "$0")/lib.sh"
need_root --nat
need_bins "$DELAY_PROXY" "$NETPROBE"

up --hosts 3 --nat 1
for h in h1 h2 h3; do
  bg_on "$h" "$T_TMP/echo-$h.log" "$NETPROBE" server --listen 0.0.0.0:9000
done
for h in h1 h2 h3; do wait_listen "$h" 9000; done
h1=$(nl addr h1)
h2=$(nl addr h2)
rtt() {  # FROM TO_ADDR -> "rtt_ms ..." line
  nl exec "$1" -- "$NETPROBE" rtt --connect "$2:9000" --count 15 --timeout-ms 20000
}

r=$(rtt h2 "$h1")
note "h2 -> h1 plain: $r"
check "plain RTT is small (< 20 ms)" between "$(field median "$r")" 0 20

nl delay h2 --ms 20
r=$(rtt h2 "$h1")
note "h2 -> h1, h2 delayed 20 ms: $r"
check "delayed host's RTT min >= 40 ms" between "$(field min "$r")" 39.9 1000
check "delayed host's RTT median within [40, 55] ms" between "$(field median "$r")" 40 55
r=$(rtt h1 "$h2")
note "h1 -> h2 (dialed by the undelayed host): $r"
check "connections dialed by others are not delayed (< 20 ms)" between "$(field median "$r")" 0 20

nl delay h3 --ms 15 --jitter-ms 3
r=$(rtt h3 "$h1")
note "h3 (NAT) -> h1, 15 +- 3 ms: $r"
check "NATed host's delayed RTT within [24, 45] ms" between "$(field median "$r")" 24 45
check "status shows the delays" bash -c "'$NETLAB' --name '$T_RUN' status | grep -q 'delay_ms=15'"

nl delay h2 --off
r=$(rtt h2 "$h1")
note "h2 -> h1 after --off: $r"
check "--off restores the plain RTT (< 20 ms)" between "$(field median "$r")" 0 20
check "--off removed the redirect rule" \
  bash -c "! ip netns exec '$(nl ns h2)' iptables -t nat -S OUTPUT | grep -q REDIRECT"

# Delay plus a 20 Mbit/s cap: a bulk echo through the proxy still gets the capped rate
# (the proxy's buffers cover the 40 ms bandwidth-delay product).
nl shape h2 --up 20 --down 20
nl delay h2 --ms 20
b=$(nl exec h2 -- "$NETPROBE" bulk --connect "$h1:9000" --bytes 8000000 --timeout-ms 30000)
note "h2 -> h1 bulk with 20 Mbit/s + 20 ms: $b"
check "throughput with delay stays near the cap ($(field mbit "$b") Mbit/s in [13, 22])" \
  between "$(field mbit "$b")" 13 22
finish
