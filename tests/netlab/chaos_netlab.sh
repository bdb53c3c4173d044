#!/usr/bin/env bash
# The chaos runner on a netlab internet (root): iperf3 stand-ins for the real Starling commands
# (bootstrap = iperf3 server on h1, peers = loops of iperf3 transfers to it, one peer behind
# NAT, 20 Mbit/s links) survive seeded kills and restarts and pass the agreement check (every
# peer completed a transfer); a peer that kills itself with SIGSEGV inside a namespace is
# caught; each run's namespaces are gone afterwards.
source "$(dirname "$0")/lib.sh"
need_cmd iperf3 ss
need_root --nat
export CHAOS_QUIET=1

cat >"$T_TMP/iperf.conf" <<'CONF'
hosts = 4
nat = 1
up_mbit = 20
down_mbit = 20
peers = 3
duration_s = 8
seed = 3
kill_every_s = 2
restart_after_s = 1
term_grace_s = 3
bootstrap_cmd = exec iperf3 -s -p {bootstrap_port}
bootstrap_ready = ss -Hltn "sport = :{bootstrap_port}" | grep -q .
peer_cmd = while :; do iperf3 -c {bootstrap_addr} -p {bootstrap_port} -n 200K -f m --connect-timeout 2000 && echo "transfer ok from {host} {addr}"; sleep 0.3; done
check_cmd = for i in $(seq 1 {peers}); do cat logs/p$i.*.log | grep -q "transfer ok" || { echo "p$i never completed a transfer"; exit 1; }; done; echo agreed
CONF

run_name() { sed -nE 's/^run ([a-z0-9]+):.*/\1/p' "$1/netlab-status.txt"; }

RC=0
"$CHAOS" --config "$T_TMP/iperf.conf" --out "$T_TMP/good" >"$T_TMP/good.out" 2>&1 || RC=$?
((RC == 77)) && skip "chaos could not start netlab"
cat "$T_TMP/good/summary.txt" | head -2
check "iperf3 collaboration under chaos passes (exit $RC)" test "$RC" -eq 0
check "agreement check ran and passed" grep -q agreed "$T_TMP/good/check.log"
check "peers were killed by chaos" grep -qP '\tkilled$' "$T_TMP/good/results.tsv"
check "the NATed peer (p3 on h4) transferred through its NAT" \
  bash -c "cat '$T_TMP'/good/logs/p3.*.log | grep -q 'transfer ok from h4 10.78.4.2'"
name=$(run_name "$T_TMP/good")
check "chaos tore down its netlab run ($name)" \
  bash -c "[[ -n '$name' ]] && ! ip netns list | grep -q '^$name-'"

RC=0
"$CHAOS" --config "$T_TMP/iperf.conf" --out "$T_TMP/segv" --set duration_s=3 --set kill_every_s=0 \
  --set 'peer_cmd=if [ {i} = 2 ]; then sleep 1; kill -SEGV $$; fi; exec sleep 1000' \
  --set 'check_cmd=true' >"$T_TMP/segv.out" 2>&1 || RC=$?
cat "$T_TMP/segv/summary.txt" | head -2
check "SIGSEGV inside a namespace fails the run (exit $RC)" test "$RC" -eq 1
check "p2.1 is a CRASH by SIGSEGV" grep -qP '^p2\.1\t.*\tsignal SEGV\tCRASH$' "$T_TMP/segv/results.tsv"
name=$(run_name "$T_TMP/segv")
check "namespaces gone after the failing run too" \
  bash -c "[[ -n '$name' ]] && ! ip netns list | grep -q '^$name-'"
finish
