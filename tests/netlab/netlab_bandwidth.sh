#!/usr/bin/env bash
# A capped link measures within 10% of its cap (iperf3), in both directions, for an asymmetric
# change made with `netlab shape`, and for a host behind NAT (caps sit on its router's uplink).
# The expected numbers are the configured caps; iperf3 reports TCP goodput, which is ~4.5%
# below the tbf rate (Ethernet/IP/TCP headers), well inside the tolerance.
# iperf3 uses cubic when the kernel has it: the test measures the shaper, and this machine's
# default (bbr) on a path with ~0.1 ms RTT swings between 32 and 48 Mbit/s on a 50 Mbit/s cap
# from run to run (BBR paces at its own bandwidth estimate); cubic fills the tbf queue and
# measures 47.5-47.8 every time. Namespaces cannot change their default (the kernel allows
# only tcp_allowed_congestion_control there), so the choice is per socket (root may).
source "$(dirname "$0")/lib.sh"
need_cmd iperf3
need_root --nat

up --hosts 4 --nat 1 --up-mbit 50 --down-mbit 50
for h in h1 h2 h3 h4; do
  bg_on "$h" "$T_TMP/iperf-$h.log" iperf3 -s -p 5201
done
for h in h1 h2 h3 h4; do wait_listen "$h" 5201; done

CC=()
if grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null; then
  CC=(-C cubic)
fi

# measure FROM_HOST TO_HOST [extra iperf3 args]: prints receiver Mbit/s of a client on FROM
measure() {
  local from=$1 to=$2
  shift 2
  local out
  out=$(nl exec "$from" -- timeout 20 iperf3 -c "$(nl addr "$to" --outside)" -p 5201 -f m -t 3 -O 1 "${CC[@]}" "$@" 2>&1) || {
    echo "# iperf3 failed: $out" >&2
    echo 0
    return
  }
  awk '/receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) }' <<<"$out" | tail -1
}

# expect NAME MBIT CAP
expect() {
  local what=$1 got=$2 cap=$3
  local lo hi
  lo=$(awk -v c="$cap" 'BEGIN{print c * 0.9}')
  hi=$(awk -v c="$cap" 'BEGIN{print c * 1.1}')
  check "$what: $got Mbit/s within 10% of $cap" between "$got" "$lo" "$hi"
}

expect "h1 -> h2 (50/50)" "$(measure h1 h2)" 50
expect "h2 -> h1 (reverse)" "$(measure h1 h2 -R)" 50

nl shape h1 --up 20
expect "h1 -> h2 after 'shape h1 --up 20'" "$(measure h1 h2)" 20
nl shape h3 --down 30
expect "h2 -> h3 after 'shape h3 --down 30'" "$(measure h3 h2 -R)" 30
# Unchanged directions keep their caps.
expect "h3 -> h2 (h3 up still 50)" "$(measure h3 h2)" 50

# h4 is behind NAT: it dials out; its caps are on the router's uplink.
nl shape h4 --up 25 --down 40
expect "h4 (NAT) -> h2 upload" "$(measure h4 h2)" 25
expect "h2 -> h4 (NAT) download" "$(measure h4 h2 -R)" 40
finish
