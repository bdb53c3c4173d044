#!/usr/bin/env bash
# Soak (label "soak", on request only: STARLING_SOAK=1): the WAN-like setup of docs/netlab.md
# (8 hosts, 2 behind NAT, 50 Mbit/s, 40 ms RTT through the delay proxies) under chaos for
# STARLING_SOAK_SECONDS (default 600) with stand-ins: verified bulk echo transfers and RTT
# probes (starling-netprobe) to the bootstrap. Passes if nothing crashed or hung, every peer kept working and the RTTs show the
# configured latency. Replace the stand-ins with `starling dht` / `starling train` when they exist.
source "$(dirname "$0")/lib.sh"
[[ ${STARLING_SOAK:-} == 1 ]] || skip "soak runs only on request: STARLING_SOAK=1 ctest -L soak"
need_cmd ss
need_root --nat
need_bins "$DELAY_PROXY" "$NETPROBE"
secs=${STARLING_SOAK_SECONDS:-600}
out=${STARLING_SOAK_OUT:-$T_TMP/soak}

cat >"$T_TMP/soak.conf" <<CONF
hosts = 8
nat = 2
up_mbit = 50
down_mbit = 50
delay_ms = 20
jitter_ms = 2
peers = 7
duration_s = $secs
seed = ${STARLING_SOAK_SEED:-1}
kill_every_s = 10
restart_after_s = 3
max_dead = 2
settle_s = 10
term_grace_s = 10
bootstrap_cmd = exec $NETPROBE server --listen 0.0.0.0:{bootstrap_port}
bootstrap_ready = ss -Hltn "sport = :{bootstrap_port}" | grep -q .
peer_cmd = while :; do $NETPROBE bulk --connect {bootstrap_addr}:{bootstrap_port} --bytes 2000000 --timeout-ms 20000 && echo "transfer ok"; $NETPROBE rtt --connect {bootstrap_addr}:{bootstrap_port} --count 5 --timeout-ms 10000; sleep 1; done
check_cmd = for i in \$(seq 1 {peers}); do cat logs/p\$i.*.log | grep -q "transfer ok" || { echo "p\$i never completed a transfer"; exit 1; }; done; awk '/^rtt_ms/ { split(\$3, a, "="); if (a[2] < 35.5) { print "RTT below 2 x (20 - 2) ms: " \$0; bad = 1 } n++ } END { print n " RTT probes"; exit bad || n == 0 }' logs/p*.log
check_timeout_s = 120
CONF

RC=0
"$CHAOS" --config "$T_TMP/soak.conf" --out "$out" || RC=$?
((RC == 77)) && skip "chaos could not start netlab"
check "soak run passes (exit $RC; output in $out)" test "$RC" -eq 0
[[ $RC -eq 0 ]] || cp -r "$out" "/tmp/netlab-soak-failed-$$" 2>/dev/null || true
finish
