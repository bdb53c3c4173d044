#!/usr/bin/env bash
# Volunteers behind NATs: a public relay R (h1, `starling node --relay`: circuit relay v2 and
# AutoNAT) and two peers, B (h2) and A (h3), each behind its own NAT router. B learns from
# AutoNAT that it is private, takes a reservation with R; A dials B's /p2p-circuit address;
# B then runs DCUtR over the relayed connection. Two NAT behaviours, one netlab run each:
#   drop   port-preserving, endpoint-independent MASQUERADE that drops unsolicited inbound:
#          the hole punch succeeds and A's pings move to the direct connection;
#   random MASQUERADE --random-fully (a new outside port per connection): the punch fails
#          within DCUtR's bounds and the relayed connection keeps carrying the pings.
source "$(dirname "$0")/lib.sh"
STARLING=${STARLING:-$T_SRC/build/bin/starling}
need_root --nat
need_bins "$STARLING"

# node NAME HOST ARGS...: a `starling node` on HOST with its own identity, logging at info
node() {
  local name=$1 host=$2
  shift 2
  bg_on "$host" "$T_TMP/$name.log" env HOME="$T_TMP" "$STARLING" --log info node \
    -i "$T_TMP/$name.key" --addr-file "$T_TMP/$name.addrs" "$@"
}
peer_id() { sed -nE 's/^peer id (.*)$/\1/p' "$T_TMP/$1.log" | head -1; }

variant() {  # NAT_TYPE
  local type=$1 rc r_addr b_circuit a_id b_id
  up --hosts 3 --nat 2 --nat-type "$type"
  local b_out a_out
  b_out=$(nl addr h2 --outside)
  a_out=$(nl addr h3 --outside)
  node "r-$type" h1 -l /ip4/0.0.0.0/tcp/4001 --relay --allow-private
  check "[$type] relay R is up" wait_for_line "$T_TMP/r-$type.log" '^listening on /ip4/10\.77\.1\.1/' 10
  r_addr=$(sed -nE 's|^listening on (/ip4/10\.77\.1\.1/tcp/4001/p2p/.*)$|\1|p' "$T_TMP/r-$type.log")
  note "R at $r_addr"

  node "b-$type" h2 -l /ip4/0.0.0.0/tcp/4002 --hole-punching --allow-private \
    --relay-via "$r_addr"
  check "[$type] B holds a reservation with R (a /p2p-circuit address)" \
    wait_for_line "$T_TMP/b-$type.log" '^relayed at /ip4/10\.77\.1\.1/tcp/4001/p2p/.*/p2p-circuit/p2p/' 20
  check "[$type] AutoNAT: B is private behind its router" \
    wait_for_line "$T_TMP/b-$type.log" '^reachability private' 40
  b_circuit=$(sed -nE 's|^relayed at (.*)$|\1|p' "$T_TMP/b-$type.log" | head -1)
  b_id=$(peer_id "b-$type")

  node "a-$type" h3 -l /ip4/0.0.0.0/tcp/4003 --hole-punching --allow-private \
    --connect "$r_addr" --connect "$b_circuit" --ping-every 0.3
  check "[$type] A reached B through the relay" \
    wait_for_line "$T_TMP/a-$type.log" "^connection $b_id relayed outbound" 15
  a_id=$(peer_id "a-$type")
  check "[$type] B accepted the relayed connection from A" \
    wait_for_line "$T_TMP/b-$type.log" "^connection $a_id relayed inbound" 10
  check "[$type] A's pings go through the relay first" \
    wait_for_line "$T_TMP/a-$type.log" "^ping $b_id [0-9]+: rtt .* via relayed" 10

  if [[ $type == drop ]]; then
    # A dialed through the relay, so it is the client of the punched connection.
    check "[$type] DCUtR: A has a direct connection to B's router address $b_out:4002" \
      wait_for_line "$T_TMP/a-$type.log" "^connection $b_id direct outbound /ip4/$b_out/tcp/4002" 20
    check "[$type] DCUtR: B has the same connection as its server, from $a_out:4003" \
      wait_for_line "$T_TMP/b-$type.log" "^connection $a_id direct inbound /ip4/$a_out/tcp/4003" 10
    check "[$type] B logged the upgrade" \
      wait_for_line "$T_TMP/b-$type.log" "dcutr with .* \(B\): direct connection after" 10
    check "[$type] A's pings now use the direct connection" \
      wait_for_line "$T_TMP/a-$type.log" "^ping $b_id [0-9]+: rtt .* via direct" 10
  else
    # Three attempts, each bounded by message_timeout + dial_timeout (5 s + 5 s).
    check "[$type] DCUtR gives up within its bounds and B stays relayed" \
      wait_for_line "$T_TMP/b-$type.log" "dcutr with .* \(B\): .*staying relayed" 40
    local n
    n=$(grep -c "^ping $b_id [0-9]*: rtt" "$T_TMP/a-$type.log" || true)
    check "[$type] the relayed connection keeps working after the failed punch" \
      wait_for_line "$T_TMP/a-$type.log" "^ping $b_id $((n + 2)): rtt .* via relayed" 10
    check "[$type] no direct connection between A and B" \
      bash -c "! grep -q '^connection $b_id direct' '$T_TMP/a-$type.log'"
  fi
  grep -E "dcutr" "$T_TMP/a-$type.log" "$T_TMP/b-$type.log" | sed 's/^/# /' | head -20
  # Next variant: a fresh run.
  for p in "${T_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  T_PIDS=()
  nl down >/dev/null 2>&1 || true
  T_RUN=""
}

variant drop
variant random
finish
