#!/usr/bin/env bash
# make bench-nat: DCUtR hole punching across netlab NATs (needs root; skips with exit 77
# elsewhere). Per NAT type (tools/netlab `--nat-type`): a public relay R (h1), a peer B behind
# one NAT holding a reservation with R, and TRIES fresh peers A behind another NAT, each dialing
# B's /p2p-circuit address (a new identity and listening port per try) and pinging B every
# 0.2 s. Per try: the time from A's connection to R to the relayed connection to B (the
# anchor), the time from the relayed connection to the direct one, and the ping RTT via the
# relay and via the direct connection; per type: the punch success rate. Build directory:
# first argument (default build). BENCH_TRIES (20) tries on `drop` NATs, BENCH_FAIL_TRIES (3)
# on `reset` and `random` NATs (a failure takes DCUtR's full 3 attempts, ~30 s). Then relayed vs
# direct throughput on capped links (below; BENCH_NAT_THROUGHPUT=0 skips it). The last line of
# output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
cmake --build "$build" --target starling_cli starling-delay-proxy -j"${JOBS:-2}" >/dev/null
STARLING="$build/bin/starling"
source "$root/tests/netlab/lib.sh"
need_root --nat
TRIES=${BENCH_TRIES:-20}
FAIL_TRIES=${BENCH_FAIL_TRIES:-3}
TYPES=${BENCH_NAT_TYPES-drop reset random}
# Latency of the paths through the relay: A's and B's connections to R get RELAY_MS one way
# (starling-delay-proxy on h2 and h3, only towards R), so a relayed RTT is ~4 x RELAY_MS while
# the direct path A <-> B has none, as on the internet where the relay is far and the peers
# are not; the hole punch's cost in relayed RTTs then measures protocol round trips, not
# process time (0: no delay, as before).
RELAY_MS=${BENCH_NAT_RELAY_MS:-10}

node() {  # NAME HOST ARGS...
  local name=$1 host=$2
  shift 2
  bg_on "$host" "$T_TMP/$name.log" env HOME="$T_TMP" "$STARLING" --log info node \
    -i "$T_TMP/$name.key" "$@"
}
# t_of FILE REGEX: the t= value (ms since the node started) of the first line matching REGEX
t_of() { { grep -E "$2" "$1" || true; } | head -1 | sed -nE 's/.* t=([0-9.]+)$/\1/p'; }
# median / p90 of the numbers on stdin ("-" when none)
median() { sort -g | awk '{v[NR]=$1} END{if(NR==0){print "-"}else{print v[int((NR+1)/2)]}}'; }
p90() { sort -g | awk '{v[NR]=$1} END{if(NR==0){print "-"}else{i=int(NR*0.9+0.999);print v[i]}}'; }

# end_run: stops this run's processes and tears its netlab run down
end_run() {
  for p in "${T_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  T_PIDS=()
  nl down >/dev/null 2>&1 || true
  T_RUN=""
}

json=""
for type in $TYPES; do
  tries=$TRIES
  [[ $type == drop ]] || tries=$FAIL_TRIES
  up --hosts 3 --nat 2 --nat-type "$type"
  if ((RELAY_MS > 0)); then  # A's and B's connections to R: RELAY_MS each way (not A <-> B)
    nl delay h2 --ms "$RELAY_MS" --dst 10.77.1.1/32 >/dev/null
    nl delay h3 --ms "$RELAY_MS" --dst 10.77.1.1/32 >/dev/null
  fi
  node "r-$type" h1 -l /ip4/0.0.0.0/tcp/4001 --relay --allow-private
  wait_for_line "$T_TMP/r-$type.log" '^listening on /ip4/10\.77\.1\.1/' 10 >/dev/null
  r_addr=$(sed -nE 's|^listening on (/ip4/10\.77\.1\.1/tcp/4001/p2p/.*)$|\1|p' "$T_TMP/r-$type.log")
  r_id=${r_addr##*/}
  node "b-$type" h2 -l /ip4/0.0.0.0/tcp/4002 --hole-punching --allow-private --relay-via "$r_addr"
  wait_for_line "$T_TMP/b-$type.log" '^relayed at ' 20 >/dev/null
  b_circuit=$(sed -nE 's|^relayed at (.*)$|\1|p' "$T_TMP/b-$type.log" | head -1)
  b_id=${b_circuit##*/}
  ok=0
  : >"$T_TMP/relay_ms" >"$T_TMP/direct_ms" >"$T_TMP/rtt_rel" >"$T_TMP/rtt_dir" >"$T_TMP/ratio"
  for ((i = 1; i <= tries; i++)); do
    a="a-$type-$i"
    node "$a" h3 -l "/ip4/0.0.0.0/tcp/$((4100 + i))" --hole-punching --allow-private \
      --connect "$r_addr" --connect "$b_circuit" --ping-every 0.2
    apid=${T_PIDS[-1]}
    log="$T_TMP/$a.log"
    # Done when A has a direct connection to B and pinged over it, or DCUtR gave up.
    wait_for_line "$log" "(^ping $b_id [0-9]+: rtt .* via direct)|(dcutr with .*\(A\): .*staying relayed)" 45 \
      >/dev/null 2>&1 || true
    t_r=$(t_of "$log" "^connection $r_id direct outbound")
    t_rel=$(t_of "$log" "^connection $b_id relayed outbound")
    t_dir=$(t_of "$log" "^connection $b_id direct outbound")
    grep -E "^ping $b_id [0-9]+: rtt .* via relayed" "$log" | awk '{print $5}' >>"$T_TMP/rtt_rel" || true
    grep -E "^ping $b_id [0-9]+: rtt .* via direct" "$log" | awk '{print $5}' >>"$T_TMP/rtt_dir" || true
    rel_ms=$(awk -v a="$t_r" -v b="$t_rel" 'BEGIN{if(a==""||b=="")print "";else printf "%.1f", b-a}')
    if [[ -n $rel_ms ]]; then echo "$rel_ms" >>"$T_TMP/relay_ms"; fi
    if [[ -n $t_dir && -n $t_rel ]]; then
      ok=$((ok + 1))
      d=$(awk -v a="$t_rel" -v b="$t_dir" 'BEGIN{printf "%.1f", b-a}')
      echo "$d" >>"$T_TMP/direct_ms"
      if [[ -n $rel_ms ]]; then
        awk -v d="$d" -v r="$rel_ms" 'BEGIN{if(r>0)printf "%.2f\n", d/r}' >>"$T_TMP/ratio"
      fi
      note "$type try $i: relayed in ${rel_ms:-?} ms, direct ${d} ms later"
    else
      note "$type try $i: relayed in ${rel_ms:-?} ms, no direct connection"
    fi
    kill -TERM "$apid" 2>/dev/null || true
    wait "$apid" 2>/dev/null || true
  done
  rate=$(awk -v o="$ok" -v n="$tries" 'BEGIN{printf "%.0f", 100*o/n}')
  rel_med=$(median <"$T_TMP/relay_ms") rel_p90=$(p90 <"$T_TMP/relay_ms")
  dir_med=$(median <"$T_TMP/direct_ms") dir_p90=$(p90 <"$T_TMP/direct_ms")
  ratio=$(median <"$T_TMP/ratio")
  rtt_rel=$(median <"$T_TMP/rtt_rel") rtt_dir=$(median <"$T_TMP/rtt_dir")
  in_rtts=$(awk -v a="$dir_med" -v b="$rtt_rel" 'BEGIN{if(a=="-"||b=="-"||b==0)print "-";else printf "%.1f", a/b}')
  rtt_ratio=$(awk -v a="$rtt_dir" -v b="$rtt_rel" 'BEGIN{if(a=="-"||b=="-"||b==0)print "-";else printf "%.2f", a/b}')
  echo "nat=$type tries=$tries punched=$ok rate=${rate}% relayed_ms(anchor) median=$rel_med p90=$rel_p90" \
    "relayed_to_direct_ms median=$dir_med p90=$dir_p90 ratio_to_relayed_setup=$ratio" \
    "in_relayed_rtts=$in_rtts" \
    "ping_ms relayed=$rtt_rel direct=$rtt_dir direct/relayed=$rtt_ratio"
  json+="${json:+,}\"$type\":{\"tries\":$tries,\"punched\":$ok,\"relayed_ms\":\"$rel_med\",\"direct_after_ms\":\"$dir_med\",\"direct_p90_ms\":\"$dir_p90\",\"ping_relayed_ms\":\"$rtt_rel\",\"ping_direct_ms\":\"$rtt_dir\"}"
  end_run
done
# Throughput through the relay vs direct between the same two peers on capped links (every
# host BENCH_NAT_MBIT Mbit/s each way, tc tbf): B sits behind a "upnp" router and maps its port
# (NAT-PMP), so it is reachable both at the mapped address and through R; A, behind a "drop"
# NAT, echoes BENCH_NAT_MIB MiB to B over each path in turn, BENCH_NAT_REPS times (a fresh
# connection each time). R is `starling dht` with its circuit limits lifted (the spec's default
# 128 KiB would reset the relayed echo). Through the relay every byte crosses R's link in both
# directions, so on equal caps the relay is expected to give about half the direct rate.
if [[ ${BENCH_NAT_THROUGHPUT:-1} == 1 ]]; then
  MBIT=${BENCH_NAT_MBIT:-20}
  MIB=${BENCH_NAT_MIB:-4}
  REPS=${BENCH_NAT_REPS:-5}
  up --hosts 3 --nat 2 --nat-type upnp,drop --up-mbit "$MBIT" --down-mbit "$MBIT"
  bg_on h1 "$T_TMP/r-tput.log" env HOME="$T_TMP" "$STARLING" --log info dht -i "$T_TMP/r-tput.key" \
    --listen /ip4/10.77.1.1/tcp/4001 --allow-private --relay-circuit-kib 0 \
    --relay-circuit-seconds 0 --addr-file "$T_TMP/r-tput.addr"
  wait_for_line "$T_TMP/r-tput.addr" '/p2p/' 15 >/dev/null
  r_addr=$(head -1 "$T_TMP/r-tput.addr")
  node b-tput h2 -l /ip4/0.0.0.0/tcp/4002 --allow-private --relay-via "$r_addr" \
    --port-mapping natpmp
  wait_for_line "$T_TMP/b-tput.log" '^relayed at ' 20 >/dev/null
  wait_for_line "$T_TMP/b-tput.log" '^port mapped natpmp ' 20 >/dev/null
  b_circuit=$(sed -nE 's|^relayed at (.*)$|\1|p' "$T_TMP/b-tput.log" | head -1)
  b_id=${b_circuit##*/}
  b_direct=$(sed -nE 's|^port mapped natpmp ([0-9.]+):([0-9]+) .*|/ip4/\1/tcp/\2|p' "$T_TMP/b-tput.log" | head -1)/p2p/$b_id
  bytes=$((MIB * 1024 * 1024))
  : >"$T_TMP/tput_relayed" >"$T_TMP/tput_direct"
  echo_once() {  # PATH ADDR: one echo of $bytes from A (h3), MiB/s each way appended to tput_PATH
    local out secs
    out=$("$NETLAB" --name "$T_RUN" exec h3 -- env HOME="$T_TMP" "$STARLING" echo "$2" \
      --bytes "$bytes" --timeout 120 2>&1) || { note "echo over $1 failed: $out"; return 0; }
    secs=$(sed -nE 's/^echo: 1 stream\(s\) x [0-9]+ bytes intact in ([0-9.]+) s$/\1/p' <<<"$out")
    [[ -n $secs ]] && awk -v b="$bytes" -v s="$secs" 'BEGIN{printf "%.3f\n", b/1048576/s}' >>"$T_TMP/tput_$1"
  }
  for ((i = 1; i <= REPS; i++)); do
    echo_once direct "$b_direct"
    echo_once relayed "$b_circuit"
  done
  t_dir=$(median <"$T_TMP/tput_direct") t_rel=$(median <"$T_TMP/tput_relayed")
  t_ratio=$(awk -v a="$t_rel" -v b="$t_dir" 'BEGIN{if(a=="-"||b=="-"||b==0)print "-";else printf "%.2f", a/b}')
  echo "throughput cap=${MBIT}Mbit/s echo=${MIB}MiB reps=$REPS MiB/s each way:" \
    "direct(anchor) median=$t_dir relayed median=$t_rel relayed/direct=$t_ratio" \
    "(direct: $(tr '\n' ' ' <"$T_TMP/tput_direct")relayed: $(tr '\n' ' ' <"$T_TMP/tput_relayed"))"
  json+="${json:+,}\"throughput\":{\"cap_mbit\":$MBIT,\"mib\":$MIB,\"reps\":$REPS,\"direct_mib_s\":\"$t_dir\",\"relayed_mib_s\":\"$t_rel\",\"ratio\":\"$t_ratio\"}"
  end_run
fi
echo "load: $(uptime)"
echo "RESULT {$json}"
