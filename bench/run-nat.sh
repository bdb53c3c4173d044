#!/usr/bin/env bash
# make bench-nat: DCUtR hole punching across netlab NATs (needs root; skips with exit 77
# elsewhere). Per NAT type (tools/netlab `--nat-type`): a public relay R (h1), a peer B behind
# one NAT holding a reservation with R, and TRIES fresh peers A behind another NAT, each dialing
# B's /p2p-circuit address (a new identity and listening port per try) and pinging B every
# 0.2 s. Per try: the time from A's connection to R to the relayed connection to B (the
# anchor), the time from the relayed connection to the direct one, and the ping RTT via the
# relay and via the direct connection; per type: the punch success rate. Build directory:
# first argument (default build). BENCH_TRIES (20) tries on `drop` NATs, BENCH_FAIL_TRIES (3)
# on `reset` and `random` NATs (a failure takes DCUtR's full 3 attempts, ~30 s). The last line
# of output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
cmake --build "$build" --target starling_cli -j"${JOBS:-2}" >/dev/null
STARLING="$build/bin/starling"
source "$root/tests/netlab/lib.sh"
need_root --nat
TRIES=${BENCH_TRIES:-20}
FAIL_TRIES=${BENCH_FAIL_TRIES:-3}
TYPES=${BENCH_NAT_TYPES:-drop reset random}

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

json=""
for type in $TYPES; do
  tries=$TRIES
  [[ $type == drop ]] || tries=$FAIL_TRIES
  up --hosts 3 --nat 2 --nat-type "$type"
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
  for p in "${T_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  T_PIDS=()
  nl down >/dev/null 2>&1 || true
  T_RUN=""
done
echo "load: $(uptime)"
echo "RESULT {$json}"
