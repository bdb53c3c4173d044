#!/usr/bin/env bash
# `starling dht` follows AutoNAT (root): a public bootstrap node on h1 (AutoNAT server,
# --allow-private: the lab's internet is 10.77/16), a second public node on h2 and one behind a
# "drop" NAT on h3, both joining through h1. The NATed node learns it is private and switches
# its DHT to client mode (never in routing tables); the public one learns it is public and stays
# a server.
source "$(dirname "$0")/lib.sh"
STARLING=${STARLING:-$T_SRC/build/bin/starling}
need_root --nat
need_bins "$STARLING"

dht() {  # NAME HOST ARGS...
  local name=$1 host=$2
  shift 2
  bg_on "$host" "$T_TMP/$name.log" env HOME="$T_TMP" "$STARLING" --log info dht \
    -i "$T_TMP/$name.key" --allow-private "$@"
}
up --hosts 3 --nat 1 --nat-type drop
dht boot h1 --listen /ip4/10.77.1.1/tcp/4000 --addr-file "$T_TMP/boot.addr"
check "bootstrap node is up" wait_for_line "$T_TMP/boot.addr" '/p2p/' 15
boot=$(head -1 "$T_TMP/boot.addr")
dht pub h2 --listen /ip4/10.77.1.2/tcp/4000 --initial-peers "$boot"
dht nat h3 --listen /ip4/0.0.0.0/tcp/4000 --initial-peers "$boot"
check "the NATed node learns it is private" wait_for_line "$T_TMP/nat.log" '^reachability private' 40
check "... and runs its DHT in client mode" \
  wait_for_line "$T_TMP/nat.log" 'client mode \(not publicly reachable\)' 5
check "the public node learns it is public" wait_for_line "$T_TMP/pub.log" '^reachability public' 40
check "... and stays a server" bash -c "! grep -q 'client mode' '$T_TMP/pub.log'"
finish
