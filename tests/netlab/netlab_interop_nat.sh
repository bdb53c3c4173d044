#!/usr/bin/env bash
# NAT traversal interop with js-libp2p 3.3.11 (tests/interop/js/nat.mjs) in one netlab run:
# 6 public hosts and 10 behind their own `drop` NATs (port-preserving, endpoint-independent,
# silent drop: where TCP hole punching can work), all on the 11.77 block js treats as public
# (interop_lib.sh). Cases (the issue's interop section):
#  (a) a js relay (h1) carries a connection between two Starling peers behind different NATs
#      (B h7 holds a reservation with it, A h8 pings B through it);
#  (b) a js peer behind a NAT (h9) holds a reservation with a Starling relay (h2) and Starling
#      (`starling ping` from h8) reaches it through that relay;
#  (c1) DCUtR, js dials: js A (h12) dials Starling B (h11) through the Starling relay; B (the
#      spec's B, it accepted the relayed connection) drives DCUtR and the punched connection
#      carries js's pings, Starling as its server (multistream listener, Noise responder);
#  (c2) DCUtR, Starling dials: Starling A (h10) dials js B (h9) through the Starling relay; js B
#      drives DCUtR: js 3.3.11 fails there (it acts as Noise initiator; README);
#  (c3) the same with js B (h15) run with --dcutr-roles-fix (B's dial honours initiator:false):
#      the punched connection carries Starling A's (h16) pings;
#  (d) AutoNAT both ways: Starling nodes ask js AutoNAT servers (h1, h3): public on h4,
#      private behind a NAT (h13); js nodes ask the Starling server (h2): js's public listen
#      address (h3) verified, the address a js node behind a NAT (h14) listens on refused.
#      The js servers there run with --autonat-dial-new; a stock js server (h5) asked by
#      Starling (h6) shows js 3.3.11's bug: it answers from, then closes, the requester's own
#      connection (Starling must get no verdict from it).
# js dials every TCP connection from one local port and adopts its relay-observed address
# (nat.mjs --local-port/--observed adopt): stock js cannot hole-punch without that.
# STARLING_INTEROP_NO_PUNCH=1 starts the Starling peers without --hole-punching (the DCUtR
# checks must then fail); STARLING_INTEROP_NO_RELAY=1 points (a)'s reservation at a js peer that
# is no relay (the relay checks must then fail).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/interop_lib.sh"
STARLING=${STARLING:-$T_SRC/build/bin/starling}
need_root --nat
need_bins "$STARLING"
need_cmd node jq
js_setup

punch=(--hole-punching)
[[ -n ${STARLING_INTEROP_NO_PUNCH:-} ]] && punch=()
# wait_json NAME EVENT [REGEX [SECONDS]]: waits for an EVENT line (matching REGEX) from js NAME
wait_json() {
  local f=$T_TMP/$1.json re="\"event\":\"$2\"${3:+.*$3}" i
  for ((i = 0; i < ${4:-20} * 10; i++)); do
    grep -qE "$re" "$f" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "# timed out waiting for /$re/ in $f; its last lines:" >&2
  tail -3 "$f" >&2
  return 1
}

up --hosts 16 --nat 10 --nat-type drop
public_block

# Relays and servers. JR: js relay + AutoNAT server; SR: Starling relay + AutoNAT server.
js_on h1 jr relay --listen "/ip4/$(pub_addr h1)/tcp/4001" --autonat-dial-new
starling_node sr h2 -l "/ip4/$(pub_addr h2)/tcp/4002" --relay
check "js relay JR (h1) is up" wait_json jr ready "" 30
check "Starling relay SR (h2) is up" wait_for_line "$T_TMP/sr.log" "^listening on /ip4/$(pub_addr h2)/" 15
jr=$(js_field jr ready '.addrs[0]')
sr=$(sed -nE "s|^listening on (/ip4/$(pub_addr h2)/tcp/4002/p2p/.*)$|\1|p" "$T_TMP/sr.log")
note "JR $jr"
note "SR $sr"
# JS3: a public js peer with AutoNAT (a server for (d), and a client asking SR); JS5 the same
# with js's stock AutoNAT server.
js_on h3 js3 peer --listen "/ip4/$(pub_addr h3)/tcp/4003" --autonat --autonat-dial-new --dial "$sr"
js_on h5 js5 peer --listen "/ip4/$(pub_addr h5)/tcp/4005" --autonat
check "js peer JS3 (h3) is up" wait_json js3 ready "" 30
check "js peer JS5 (h5) is up" wait_json js5 ready "" 30
js3="/ip4/$(pub_addr h3)/tcp/4003/p2p/$(js_field js3 ready .id)"
js5="/ip4/$(pub_addr h5)/tcp/4005/p2p/$(js_field js5 ready .id)"

# (a) B (h7) reserves with the js relay; A (h8) pings B through it.
relay_a=$jr
if [[ -n ${STARLING_INTEROP_NO_RELAY:-} ]]; then relay_a=$js3; fi
starling_node ba h7 -l /ip4/0.0.0.0/tcp/4007 --relay-via "$relay_a"
# (c1) Starling B (h11) reserves with SR for js A.
starling_node bc h11 -l /ip4/0.0.0.0/tcp/4011 "${punch[@]}" --relay-via "$sr"
# (b, c2) js B (h9) reserves with SR, adopts its relay-observed address, runs DCUtR.
js_on h9 jsb peer --relay "$sr" --dcutr --local-port 4009 --observed adopt
js_on h15 jsf peer --relay "$sr" --dcutr --local-port 4015 --observed adopt --dcutr-roles-fix
# (d) Starling asks js servers: public (h4), behind a NAT (h13), and js's stock server (h6).
starling_node dpub h4 -l "/ip4/$(pub_addr h4)/tcp/4004" --connect "$jr" --connect "$js3"
starling_node dnat h13 -l /ip4/0.0.0.0/tcp/4013 --connect "$jr" --connect "$js3"
starling_node dstock h6 -l "/ip4/$(pub_addr h6)/tcp/4006" --connect "$js5"
# (d) js behind a NAT (h14) asks SR to check the address it listens on behind its router.
js_on h14 jsd peer --listen /ip4/0.0.0.0/tcp/4014 --autonat --autonat-dial-new --dial "$sr" \
  --candidate "/ip4/$(pub_addr h14)/tcp/4014"

# ---- (a)
check "(a) Starling B (h7) holds a reservation with the js relay" \
  wait_for_line "$T_TMP/ba.log" "^relayed at $relay_a/p2p-circuit/p2p/" 40
ba_circuit=$(sed -nE 's|^relayed at (.*)$|\1|p' "$T_TMP/ba.log" | head -1)
if [[ -n $ba_circuit ]]; then
  starling_node aa h8 -l /ip4/0.0.0.0/tcp/4008 --connect "$ba_circuit" --ping-every 0.3
  ba_id=$(node_peer_id ba)
  check "(a) Starling A (h8) reached B through the js relay" \
    wait_for_line "$T_TMP/aa.log" "^connection $ba_id relayed outbound /ip4/$(pub_addr h1)/" 15
  check "(a) A's pings to B cross the js relay" \
    wait_for_line "$T_TMP/aa.log" "^ping $ba_id 3: rtt .* via relayed" 15
  check "(a) B accepted the relayed connection from A" \
    wait_for_line "$T_TMP/ba.log" "^connection $(node_peer_id aa) relayed inbound" 10
fi

# ---- (b)
check "(b) js B (h9) holds a reservation with the Starling relay" wait_json jsb reserved "" 40
jsb_circuit=$(js_field jsb reserved '.circuit[0]')
jsb_id=$(js_field jsb ready .id)
if [[ -n $jsb_circuit ]]; then
  "$NETLAB" --name "$T_RUN" exec h8 -- env HOME="$T_TMP" "$STARLING" ping "$jsb_circuit" \
    --count 3 >"$T_TMP/ping-b.log" 2>&1 </dev/null || true
  sed 's/^/# /' "$T_TMP/ping-b.log" | head -6
  check "(b) Starling reached the js peer through the Starling relay (identify: js-libp2p)" \
    grep -q "identify: agent js-libp2p" "$T_TMP/ping-b.log"
  check "(b) three pings answered" test "$(grep -c rtt "$T_TMP/ping-b.log")" -eq 3
  check "(b) the js peer saw the relayed connection from Starling" \
    wait_json jsb conn:open "\"addr\":\"$sr/p2p-circuit/p2p/[^\"]*\",\"dir\":\"inbound\",\"limited\":true" 5
fi

# ---- (c1) js A dials Starling B through SR; Starling B punches.
bc_id=$(node_peer_id bc)
if wait_for_line "$T_TMP/bc.log" "^relayed at $sr/p2p-circuit/p2p/" 40; then
  bc_circuit=$(sed -nE 's|^relayed at (.*)$|\1|p' "$T_TMP/bc.log" | head -1)
  js_on h12 jsa peer --dial "$bc_circuit" --dcutr --local-port 4012 --observed adopt
  check "(c1) js A adopted its relay-observed address $(pub_addr h12):4012" \
    wait_json jsa observed "/ip4/$(pub_addr h12)/tcp/4012" 30
  check "(c1) js A reached Starling B through the Starling relay (relayed, limited)" \
    wait_json jsa dialed "\"peer\":\"$bc_id\".*\"limited\":true" 20
  jsa_id=$(js_field jsa ready .id)
  check "(c1) Starling B: direct inbound connection from js A's router $(pub_addr h12):4012" \
    wait_for_line "$T_TMP/bc.log" "^connection $jsa_id direct inbound /ip4/$(pub_addr h12)/tcp/4012" 30
  check "(c1) Starling B (the spec's B) logged the DCUtR upgrade" \
    wait_for_line "$T_TMP/bc.log" "dcutr with .* \(B\): direct connection after" 10
  check "(c1) js A has the direct connection (its client: outbound, not limited)" \
    wait_json jsa conn:open "\"peer\":\"$bc_id\",\"addr\":\"/ip4/$(pub_addr h11)/tcp/4011[^\"]*\",\"dir\":\"outbound\",\"limited\":false" 10
  check "(c1) js A's pings now go over the direct connection" \
    wait_json jsa ping "\"addr\":\"/ip4/$(pub_addr h11)/tcp/4011[^\"]*\",\"dir\":\"outbound\",\"limited\":false" 10
else
  fail "(c1) Starling B (h11) holds a reservation with SR"
fi
grep -hE "dcutr" "$T_TMP/bc.log" | sed 's/^/# B(h11) /' | head -4 || true

# ---- (c2) Starling A dials js B through SR; js B drives DCUtR.
if [[ -n $jsb_circuit ]]; then
  starling_node ac h10 -l /ip4/0.0.0.0/tcp/4010 "${punch[@]}" --connect "$sr" --connect "$jsb_circuit" \
    --ping-every 0.3
  check "(c2) Starling A (h10) reached js B through the Starling relay" \
    wait_for_line "$T_TMP/ac.log" "^connection $jsb_id relayed outbound" 20
  check "(c2) js B adopted its relay-observed address $(pub_addr h9):4009" \
    wait_json jsb observed "/ip4/$(pub_addr h9)/tcp/4009" 5
  # js B (the spec's B) opens /libp2p/dcutr and sends CONNECT; Starling A answers with its
  # observed address and, on SYNC, dials as the punched connection's client (multistream
  # dialer, Noise initiator). js 3.3.11 dials as client too: its dial queue drops DCUtR's
  # `initiator: false`, so both send Noise message 1 (32 bytes) and the handshake fails
  # (tests/interop/README.md). Checked: Starling's part; the direct connection if js does its
  # part, else that the failure is exactly that js defect and the relay keeps carrying the pings.
  ab="/ip4/$(pub_addr h9)/tcp/4009" ab_hp="$(pub_addr h9):4009"
  check "(c2) Starling A dialed js B's punched address $ab as the Noise initiator (the TCP punch got through)" \
    wait_for_line "$T_TMP/ac.log" "(^connection $jsb_id direct outbound $ab)|(noise handshake \(outbound\) over tcp [0-9.]+:4010->$ab_hp)" 30
  check "(c2) js B sent CONNECT and SYNC, then dialed Starling A's address $(pub_addr h10):4010" \
    wait_for_line "$T_TMP/jsb.err" "libp2p:dcutr B dialing .*/ip4/$(pub_addr h10)/tcp/4010" 5
  if wait_for_line "$T_TMP/ac.log" "^connection $jsb_id direct outbound $ab" 10 2>/dev/null; then
    pass "(c2) DCUtR: Starling A has a direct connection to js B"
    check "(c2) Starling A's pings now use the direct connection" \
      wait_for_line "$T_TMP/ac.log" "^ping $jsb_id [0-9]+: rtt .* via direct" 10
  else
    note "(c2) no direct connection: js B acted as Noise initiator on the punched connection (js defect)"
    check "(c2) ... Starling A, the initiator, got js's Noise message 1 where message 2 belongs" \
      grep -qE "noise handshake \(outbound\) .*->$ab_hp .*message 2 truncated \(32 bytes" "$T_TMP/ac.log"
    # js retries on its own schedule: a late attempt may find the DCUtR stream already closed
    # by Starling A (StreamStateError) instead of reaching the handshake; what fails the
    # handshakes it reaches is Noise (the roles). (No direct connection: the branch above.)
    check "(c2) ... js B: EncryptionFailedError on its attempts" \
      grep -qE "DCUtR on attempt [0-9]+ of 3 - EncryptionFailedError" "$T_TMP/jsb.err"
    n=$(grep -c "^ping $jsb_id [0-9]*: rtt" "$T_TMP/ac.log" || true)
    check "(c2) ... the relayed connection keeps carrying Starling A's pings" \
      wait_for_line "$T_TMP/ac.log" "^ping $jsb_id $((n + 2)): rtt .* via relayed" 10
  fi
  grep -hE "DCUtR|dcutr" "$T_TMP/jsb.err" | tail -3 | sed 's/^/# jsB(h9) /' || true
  grep -hE "dcutr|noise" "$T_TMP/ac.log" | tail -2 | sed 's/^/# A(h10) /' || true
fi

# ---- (c3) as (c2), js B with its roles fixed.
if wait_json jsf reserved "" 30; then
  jsf_id=$(js_field jsf ready .id)
  starling_node af h16 -l /ip4/0.0.0.0/tcp/4016 "${punch[@]}" --connect "$sr" \
    --connect "$(js_field jsf reserved '.circuit[0]')" --ping-every 0.3
  check "(c3) Starling A (h16) reached js B (h15, roles fixed) through the Starling relay" \
    wait_for_line "$T_TMP/af.log" "^connection $jsf_id relayed outbound" 20
  check "(c3) DCUtR: Starling A has a direct connection to js B's router $(pub_addr h15):4015" \
    wait_for_line "$T_TMP/af.log" "^connection $jsf_id direct outbound /ip4/$(pub_addr h15)/tcp/4015" 30
  check "(c3) Starling A's pings now use the direct connection" \
    wait_for_line "$T_TMP/af.log" "^ping $jsf_id [0-9]+: rtt .* via direct" 10
  check "(c3) js B: DCUtR succeeded" wait_for_line "$T_TMP/jsf.err" "libp2p:dcutr DCUtR to .* succeeded" 5
else
  fail "(c3) js B (h15) holds a reservation with the Starling relay"
fi

# ---- (d) AutoNAT
check "(d) Starling (h4, public) asked js servers: reachability public" \
  wait_for_line "$T_TMP/dpub.log" "^reachability public" 30
check "(d) Starling (h13, behind a NAT) asked js servers: reachability private" \
  wait_for_line "$T_TMP/dnat.log" "^reachability private" 40
check "(d) ... and the private verdict came from a js server's E_DIAL_ERROR" \
  grep -qE "autonat: reachability private \(.* said E_DIAL_ERROR\)" "$T_TMP/dnat.log"
check "(d) js JS3 (public) asked the Starling server: its listen address verified" \
  wait_json js3 autonat "\"server\":\"${sr##*/}\",\"addr\":\"/ip4/$(pub_addr h3)/tcp/4003\",\"success\":1,\"failure\":0,\"verified\":true" 40
check "(d) js behind a NAT (h14) asked the Starling server: its address failed the dial-back" \
  wait_json jsd autonat "\"server\":\"${sr##*/}\",\"addr\":\"/ip4/$(pub_addr h14)/tcp/4014\",\"success\":0,\"failure\":1,\"verified\":false" 40
dstock_id=$(node_peer_id dstock)
check "(d) js's stock AutoNAT server (h5), asked by Starling (h6), took the request's own connection for its dial-back" \
  wait_for_line "$T_TMP/js5.err" "auto-nat:error tried to dial /ip4/$(pub_addr h6)/tcp/4006/p2p/$dstock_id but dialed /ip4/$(pub_addr h6)/tcp/[0-9]+/p2p/" 30
check "(d) ... then closed that connection (Starling saw it go)" \
  wait_for_line "$T_TMP/dstock.log" "^disconnected $(js_field js5 ready .id)" 10
check "(d) ... and Starling took no verdict from it" bash -c "! grep -q '^reachability' '$T_TMP/dstock.log'"
finish
