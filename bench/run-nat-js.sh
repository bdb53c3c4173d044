#!/usr/bin/env bash
# The js-libp2p anchor of `make bench-nat` (needs root and node/npm; skips with exit 77
# elsewhere). One netlab run with `drop` NATs (port-preserving, endpoint-independent, silent
# drop) on the 11.77 block js treats as public (tests/netlab/interop_lib.sh): on h1 a Starling
# relay and a js-libp2p relay; behind one NAT (h2) the B peers holding reservations: Starling B,
# js B (stock js-libp2p 3.3.11) and js B with --dcutr-roles-fix; behind another NAT (h3), per
# try, a fresh A of each kind dials its B's /p2p-circuit address and pings it (Starling A to
# Starling B, js A to each js B). The three kinds take turns within each try, so load affects
# them alike. Per kind: time from A's connection to its relay to the relayed connection to B,
# DCUtR success over BENCH_TRIES (20) tries, time from the relayed connection to the direct one
# (median, p90), ping RTT over the relay and direct; then the js/Starling ratios. js peers dial
# from one local port and adopt their relay-observed address (nat.mjs --local-port/--observed
# adopt; stock js cannot punch without that). The last line of output is `RESULT {json}`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
cmake --build "$build" --target starling_cli -j"${JOBS:-2}" >/dev/null
STARLING="$build/bin/starling"
source "$root/tests/netlab/lib.sh"
source "$root/tests/netlab/interop_lib.sh"
need_root --nat
need_cmd node jq
js_setup
TRIES=${BENCH_TRIES:-20}

t_of() { { grep -E "$2" "$1" || true; } | head -1 | sed -nE 's/.* t=([0-9.]+)$/\1/p'; }
jt_of() { { grep -E "$2" "$T_TMP/$1.json" || true; } | head -1 | jq -r '.t // empty'; }
median() { sort -g | awk '{v[NR]=$1} END{if(NR==0){print "-"}else{print v[int((NR+1)/2)]}}'; }
p90() { sort -g | awk '{v[NR]=$1} END{if(NR==0){print "-"}else{i=int(NR*0.9+0.999);print v[i]}}'; }
diff_ms() { awk -v a="$1" -v b="$2" 'BEGIN{if(a==""||b=="")print "";else printf "%.1f", b-a}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if(a=="-"||b=="-"||a==0)print "-";else printf "%.2f", b/a}'; }
# record KIND FILE VALUE: appends VALUE (if any) to $T_TMP/KIND.FILE
record() { if [[ -n $3 ]]; then echo "$3" >>"$T_TMP/$1.$2"; fi; }

up --hosts 3 --nat 2 --nat-type drop
public_block
r_ip=$(pub_addr h1)
starling_node sr h1 -l "/ip4/$r_ip/tcp/4001" --relay
js_on h1 jr relay --listen "/ip4/$r_ip/tcp/4101"
wait_for_line "$T_TMP/sr.log" "^listening on /ip4/$r_ip/" 15 >/dev/null
wait_for_line "$T_TMP/jr.json" '"event":"ready"' 30 >/dev/null
sr=$(sed -nE "s|^listening on (/ip4/$r_ip/tcp/4001/p2p/.*)$|\1|p" "$T_TMP/sr.log")
jr=$(js_field jr ready '.addrs[0]')
starling_node sb h2 -l /ip4/0.0.0.0/tcp/4002 --hole-punching --relay-via "$sr"
js_on h2 jb peer --relay "$jr" --dcutr --local-port 4102 --observed adopt
js_on h2 fb peer --relay "$jr" --dcutr --local-port 4103 --observed adopt --dcutr-roles-fix
wait_for_line "$T_TMP/sb.log" '^relayed at ' 30 >/dev/null
wait_for_line "$T_TMP/jb.json" '"event":"reserved"' 30 >/dev/null
wait_for_line "$T_TMP/fb.json" '"event":"reserved"' 30 >/dev/null
sb_circuit=$(sed -nE 's|^relayed at (.*)$|\1|p' "$T_TMP/sb.log" | head -1)
sb_id=${sb_circuit##*/}
sr_id=${sr##*/}
# KIND: st = Starling A -> Starling B; js = js A -> js B (stock); fix = js A -> js B with
# --dcutr-roles-fix; mix = js A -> Starling B (js's DCUtR as A, Starling's as B).
KINDS="st js fix mix"
declare -A circuit=([js]=$(js_field jb reserved '.circuit[0]') [fix]=$(js_field fb reserved '.circuit[0]')
  [mix]=$sb_circuit)
declare -A base=([js]=4200 [fix]=4300 [mix]=4400)
declare -A ok=([st]=0 [js]=0 [fix]=0 [mix]=0)
# gave_up KIND: how many DCUtR exchanges KIND's B has given up so far
gave_up() {
  case $1 in
    js) grep -c "DCUtR on attempt 3 of 3" "$T_TMP/jb.err" || true ;;
    fix) grep -c "DCUtR on attempt 3 of 3" "$T_TMP/fb.err" || true ;;
    mix) grep -cE "dcutr with .*\(B\): .*staying relayed" "$T_TMP/sb.log" || true ;;
  esac
}
: >"$T_TMP/loads"

starling_try() {  # I
  local i=$1 a="st-a$1" log apid t_r t_rel t_dir
  starling_node "$a" h3 -l "/ip4/0.0.0.0/tcp/$((4100 + i))" --hole-punching --connect "$sr" \
    --connect "$sb_circuit" --ping-every 0.2
  apid=${T_PIDS[-1]} log="$T_TMP/$a.log"
  wait_for_line "$log" "(^ping $sb_id [0-9]+: rtt .* via direct)|(dcutr with .*\(A\): .*staying relayed)" 45 \
    >/dev/null 2>&1 || true
  t_r=$(t_of "$log" "^connection $sr_id direct outbound")
  t_rel=$(t_of "$log" "^connection $sb_id relayed outbound")
  t_dir=$(t_of "$log" "^connection $sb_id direct outbound")
  record st relay_ms "$(diff_ms "$t_r" "$t_rel")"
  grep -E "^ping $sb_id [0-9]+: rtt .* via relayed" "$log" | awk '{print $5}' >>"$T_TMP/st.rtt_rel" || true
  grep -E "^ping $sb_id [0-9]+: rtt .* via direct" "$log" | awk '{print $5}' >>"$T_TMP/st.rtt_dir" || true
  if [[ -n $t_dir && -n $t_rel ]]; then
    ok[st]=$((ok[st] + 1))
    record st direct_ms "$(diff_ms "$t_rel" "$t_dir")"
  fi
  kill -TERM "$apid" 2>/dev/null || true
  wait "$apid" 2>/dev/null || true
}

js_try() {  # KIND I: a js A dials KIND's B
  local kind=$1 i=$2 a="$1-a$2" port apid b_id given t_r t_rel t_dir
  port=$((base[$kind] + i))
  b_id=${circuit[$kind]##*/}
  given=$(gave_up "$kind")
  js_on h3 "$a" peer --dial "${circuit[$kind]}" --dcutr --local-port "$port" --observed adopt \
    --ping-every 200
  apid=${T_PIDS[-1]}
  # Done when A pinged B over a direct connection, or B's DCUtR gave up (3 attempts), or 40 s.
  local k
  for ((k = 0; k < 400; k++)); do
    grep -qE "\"event\":\"ping\".*\"peer\":\"$b_id\".*\"limited\":false" "$T_TMP/$a.json" 2>/dev/null && break
    (($(gave_up "$kind") > given)) && break
    sleep 0.1
  done
  # From the circuit dial (after nat.mjs took the relay's observed address: a helper step).
  t_r=$(jt_of "$a" '"event":"dialing"')
  t_rel=$(jt_of "$a" "\"event\":\"conn:open\".*\"peer\":\"$b_id\".*\"limited\":true")
  t_dir=$(jt_of "$a" "\"event\":\"conn:open\".*\"peer\":\"$b_id\".*\"limited\":false")
  record "$kind" relay_ms "$(diff_ms "$t_r" "$t_rel")"
  { grep -E "\"event\":\"ping\".*\"peer\":\"$b_id\".*\"limited\":true" "$T_TMP/$a.json" || true; } |
    jq -r .rtt >>"$T_TMP/$kind.rtt_rel"
  { grep -E "\"event\":\"ping\".*\"peer\":\"$b_id\".*\"limited\":false" "$T_TMP/$a.json" || true; } |
    jq -r .rtt >>"$T_TMP/$kind.rtt_dir"
  if [[ -n $t_dir && -n $t_rel ]]; then
    ok[$kind]=$((ok[$kind] + 1))
    record "$kind" direct_ms "$(diff_ms "$t_rel" "$t_dir")"
  fi
  kill -TERM "$apid" 2>/dev/null || true
  wait "$apid" 2>/dev/null || true
}

for k in $KINDS; do : >"$T_TMP/$k.relay_ms" >"$T_TMP/$k.direct_ms" >"$T_TMP/$k.rtt_rel" >"$T_TMP/$k.rtt_dir"; done
for ((i = 1; i <= TRIES; i++)); do
  cut -d' ' -f1 /proc/loadavg >>"$T_TMP/loads"
  starling_try "$i"
  js_try js "$i"
  js_try fix "$i"
  js_try mix "$i"
  note "try $i: punched starling ${ok[st]}, js ${ok[js]}, js-roles-fixed ${ok[fix]}, js-A/starling-B ${ok[mix]}"
done

declare -A m
for k in $KINDS; do
  m[$k.rel]=$(median <"$T_TMP/$k.relay_ms") m[$k.relp90]=$(p90 <"$T_TMP/$k.relay_ms")
  m[$k.dir]=$(median <"$T_TMP/$k.direct_ms") m[$k.dirp90]=$(p90 <"$T_TMP/$k.direct_ms")
  m[$k.prel]=$(median <"$T_TMP/$k.rtt_rel") m[$k.pdir]=$(median <"$T_TMP/$k.rtt_dir")
done
load=$(median <"$T_TMP/loads")
fmt="%-32s %9s %10s %10s %10s %7s %7s %7s\n"
echo "js-libp2p anchor, nat=drop, $TRIES tries per kind (interleaved), load median $load"
echo "kinds: st = Starling A -> Starling B; js = js-libp2p 3.3.11 A -> js B; fix = js A -> js B" \
  "with --dcutr-roles-fix; mix = js A -> Starling B; ratios: kind / st"
printf "$fmt" "" st js fix mix "js/st" "fix/st" "mix/st"
printf "$fmt" "hole punches" "${ok[st]}/$TRIES" "${ok[js]}/$TRIES" "${ok[fix]}/$TRIES" \
  "${ok[mix]}/$TRIES" "$(ratio "${ok[st]}" "${ok[js]}")" "$(ratio "${ok[st]}" "${ok[fix]}")" \
  "$(ratio "${ok[st]}" "${ok[mix]}")"
row() {  # LABEL KEY
  printf "$fmt" "$1" "${m[st.$2]}" "${m[js.$2]}" "${m[fix.$2]}" "${m[mix.$2]}" \
    "$(ratio "${m[st.$2]}" "${m[js.$2]}")" "$(ratio "${m[st.$2]}" "${m[fix.$2]}")" \
    "$(ratio "${m[st.$2]}" "${m[mix.$2]}")"
}
row "to the relayed conn, ms" rel
row "  p90" relp90
row "relayed -> direct conn, ms" dir
row "  p90" dirp90
row "ping over the relay, ms" prel
row "ping direct, ms" pdir
json=""
for k in $KINDS; do
  json+="${json:+,}\"$k\":{\"tries\":$TRIES,\"punched\":${ok[$k]},\"relayed_ms\":\"${m[$k.rel]}\",\"direct_after_ms\":\"${m[$k.dir]}\",\"direct_p90_ms\":\"${m[$k.dirp90]}\",\"ping_relayed_ms\":\"${m[$k.prel]}\",\"ping_direct_ms\":\"${m[$k.pdir]}\"}"
done
echo "load: $(uptime)"
if [[ -n ${BENCH_KEEP:-} ]]; then cp -r "$T_TMP" "$BENCH_KEEP"; fi  # the logs, for a look
echo "RESULT {\"nat\":\"drop\",\"load\":\"$load\",$json}"
