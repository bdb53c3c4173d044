# netlab: the port-mapping gateway (NAT type "upnp"), sourced by tools/netlab/netlab.
#
# A upnp router NATs like the "drop" type (port-preserving MASQUERADE, unsolicited inbound
# dropped) and runs Debian's miniupnpd (nftables backend), which answers UPnP IGD (SSDP +
# SOAP) and NAT-PMP/PCP requests from its LAN and forwards the ports it maps (DNAT rules in
# its own nft table "miniupnpd"; the FORWARD chain accepts DNATed connections).
#
# miniupnpd refuses to map anything while its WAN address is in a reserved range (it assumes
# a NAT behind a NAT), so a upnp router's WAN address is $UPNP_PREFIX.2.<i> (11.77.0.0/16, not
# a private or reserved block) instead of 10.77.2.<i>. The block exists only inside the run's
# namespaces: every public host and router gets an on-link route to it, and the upnp router
# one back to 10.77.0.0/16.

readonly UPNP_PREFIX=11.77  # upnp routers' WAN addresses 11.77.2.<i>/16

upnp_preflight() {
  command -v miniupnpd >/dev/null || skip "'miniupnpd' not found (install miniupnpd-nftables)"
  command -v nft >/dev/null || skip "'nft' not found (install nftables)"
}

# upnp_router RNS I DIR: configures router namespace RNS (its wan already up, no address yet)
# as a port-mapping gateway for host I and starts miniupnpd; files under DIR (the run dir).
upnp_router() {
  local rns=$1 i=$2 dir=$3
  ip -n "$rns" addr add "$UPNP_PREFIX.2.$i/16" dev wan
  ip -n "$rns" route add "$PUBLIC_PREFIX.0.0/16" dev wan
  ip netns exec "$rns" nft -f - <<'NFT'
table inet miniupnpd {
  chain forward { type filter hook forward priority 0; policy accept; jump miniupnpd; }
  chain miniupnpd { }
  chain prerouting { type nat hook prerouting priority -100; policy accept; jump prerouting_miniupnpd; }
  chain postrouting { type nat hook postrouting priority 100; policy accept; jump postrouting_miniupnpd; }
  chain prerouting_miniupnpd { }
  chain postrouting_miniupnpd { }
}
NFT
  ip netns exec "$rns" iptables -A FORWARD -i wan -o lan -m conntrack --ctstate DNAT -j ACCEPT
  local conf="$dir/upnp/r$i.conf" log="$dir/logs/miniupnpd-r$i.log"
  mkdir -p "$dir/upnp"
  cat >"$conf" <<EOF
ext_ifname=wan
listening_ip=lan
enable_natpmp=yes
enable_upnp=yes
min_lifetime=1
secure_mode=yes
system_uptime=no
upnp_table_name=miniupnpd
upnp_nat_table_name=miniupnpd
lease_file=$dir/upnp/r$i.leases
uuid=$(cat /proc/sys/kernel/random/uuid)
allow $UPNP_ALLOW $NAT_PREFIX.$i.0/24 1024-65535
deny 0-65535 0.0.0.0/0 0-65535
EOF
  : >"$log"
  setsid ip netns exec "$rns" miniupnpd -d -f "$conf" -P "$dir/upnp/r$i.pid" \
    >"$log" 2>&1 </dev/null &
  local pid=$! t
  for t in $(seq 1 100); do
    grep -q 'Listening for NAT-PMP' "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  grep -q 'Listening for NAT-PMP' "$log" || { cat "$log" >&2; return 1; }
  echo "$UPNP_PREFIX.2.$i" >"$dir/hosts/r$i/addr"
}

# upnp_routes NS DEV: the on-link route to the upnp routers' WAN block.
upnp_routes() {
  ip -n "$1" route add "$UPNP_PREFIX.0.0/16" dev "$2" 2>/dev/null || true
}
