#!/usr/bin/env bash
# Port mapping through a home router (root): h1 is public (`starling node --relay`: AutoNAT
# server), h2 sits behind a netlab "upnp" router running Debian's miniupnpd (UPnP IGD,
# NAT-PMP and PCP), h3 behind a plain NAT. On h2:
#   B1 (port 4002) maps with NAT-PMP, B2 (port 4012) with UPnP IGD, B4 (port 4022) with PCP,
#   each with a 6 s lease: the
#   mapping is granted, the mapped address 11.77.2.2:<port> announced, AutoNAT on h1 dials it
#   back (reachability public), h3 dials it directly, the lease is renewed so the mapping
#   outlives it, and a clean stop removes it from the router;
#   B3 asks for port 900, which the router's rules refuse: a clear log line, nothing announced.
source "$(dirname "$0")/lib.sh"
STARLING=${STARLING:-$T_SRC/build/bin/starling}
need_root --nat
need_cmd miniupnpd nft
need_bins "$STARLING"

has_dnat() {  # PORT: the router's DNAT rule for PORT exists (the listing is kept for the log)
  local try
  for try in 1 2 3 4 5; do  # a listing can fail while miniupnpd commits a batch: list again
    nl exec r2 -- nft list chain inet miniupnpd prerouting_miniupnpd >"$T_TMP/chain.txt" 2>&1 &&
      break
    sleep 0.2
  done
  grep -q "dport $1 dnat" "$T_TMP/chain.txt"
}
no_dnat() { ! has_dnat "$1"; }
lines_at_least() {  # FILE REGEX N SECONDS: waits until FILE has N lines matching REGEX
  local i
  for ((i = 0; i < $4 * 10; i++)); do
    (($(grep -cE "$2" "$1" || true) >= $3)) && return 0
    sleep 0.1
  done
  return 1
}

up --hosts 3 --nat 2 --nat-type upnp,reset --upnp-allow 1024-65535
ext=$(nl addr h2 --outside)
check "the upnp router's outside address is outside the private ranges ($ext)" \
  test "$ext" = 11.77.2.2

starling_node r h1 -l /ip4/0.0.0.0/tcp/4001 --relay
check "R is up" wait_for_line "$T_TMP/r.log" '^listening on /ip4/10\.77\.1\.1/tcp/4001/' 10
r_addr=$(sed -nE 's|^listening on (/ip4/10\.77\.1\.1/tcp/4001/p2p/.*)$|\1|p' "$T_TMP/r.log")

mapping() {  # NAME PROTO PORT
  local name=$1 proto=$2 port=$3 id
  starling_node "$name" h2 -l "/ip4/0.0.0.0/tcp/$port" --port-mapping "$proto" \
    --port-mapping-lifetime 6 --connect "$r_addr"
  check "[$proto] the router granted $ext:$port" \
    wait_for_line "$T_TMP/$name.log" "^port mapped $proto $ext:$port -> $port$" 15
  check "[$proto] the mapped address is announced" \
    wait_for_line "$T_TMP/$name.log" "^listening on /ip4/$ext/tcp/$port/p2p/" 5
  check "[$proto] the router holds the forwarding rule" has_dnat "$port"
  has_dnat "$port" || sed 's/^/# /' "$T_TMP/chain.txt"
  check "[$proto] AutoNAT: R dialled the mapped address back, B is public" \
    wait_for_line "$T_TMP/$name.log" '^reachability public' 40
  id=$(node_peer_id "$name")
  # Past the 6 s lease: renewed twice (at half of it each time), then dialled from outside.
  check "[$proto] the lease was renewed twice, before each expiry" \
    lines_at_least "$T_TMP/$name.log" "portmap: $proto renewed TCP $ext:$port " 2 15
  starling_node "c-$name" h3 -l /ip4/0.0.0.0/tcp/0 --connect "/ip4/$ext/tcp/$port/p2p/$id"
  check "[$proto] a peer behind another NAT dials B directly at the mapped address" \
    wait_for_line "$T_TMP/c-$name.log" "^connection $id direct outbound /ip4/$ext/tcp/$port" 15
  kill -TERM "${NODE_PID[$name]}"
  check "[$proto] B stopped cleanly" wait_for_line "$T_TMP/$name.log" '^stopped$' 10
  check "[$proto] the stop removed the mapping from the router" no_dnat "$port"
  grep -E 'portmap' "$T_TMP/$name.log" | sed 's/^/# /' | head -6
}

mapping b1 natpmp 4002
mapping b2 upnp 4012
mapping b4 pcp 4022

# Ports below 1024 are outside the router's allow rule (--upnp-allow 1024-65535).
starling_node b3 h2 -l /ip4/0.0.0.0/tcp/900 --port-mapping upnp
check "[refused] the router's refusal is logged with its reason" \
  wait_for_line "$T_TMP/b3.log" 'portmap: the router \(upnp at .*\) refused to map TCP port 900: .*606' 15
check "[refused] no port mapped" wait_for_line "$T_TMP/b3.log" '^port mapping none yet' 15
check "[refused] nothing announced at the router's address" \
  bash -c "! grep -q '^listening on /ip4/$ext/' '$T_TMP/b3.log'"
finish
