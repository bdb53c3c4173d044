#!/usr/bin/env bash
# After `netlab down` nothing is left: no namespaces, no links/bridges, no iptables rules, no
# routes in the root namespace, no processes (plain, daemonized, delay proxy, in routers and in
# the bridge namespace), no state. Also: down is idempotent, a failing `up` cleans up after
# itself, and down works from the namespaces alone when the state directory was lost.
source "$(dirname "$0")/lib.sh"
need_cmd iperf3 iptables-save
need_root --nat
need_bins "$DELAY_PROXY"

snapshot() {  # root-namespace state that netlab must never change
  {
    echo "## links"
    ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
    echo "## routes"
    ip route show table all | sort
    echo "## iptables"
    iptables-save 2>/dev/null | { grep -vE '^#|^:' || true; } | sort
  } >"$1"
}
alive() {  # pid: running (not a zombie)
  [[ -r /proc/$1/stat ]] && [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]
}
ns_of() { ip netns list | awk '{print $1}' | grep -E "^$1-" || true; }

snapshot "$T_TMP/before"

# 1. A full run with processes everywhere, then down.
up --hosts 3 --nat 1 --up-mbit 20 --down-mbit 20
name=$T_RUN
(nl exec h1 -- sleep 1000 </dev/null >/dev/null 2>&1 &)             # orphaned plain process
nl exec h2 -- iperf3 -s -D -p 5201 >/dev/null                         # daemonizes itself
(nl exec r3 -- sleep 1000 </dev/null >/dev/null 2>&1 &)              # in the NAT router
(nl exec net -- sleep 1000 </dev/null >/dev/null 2>&1 &)             # in the bridge namespace
nl delay h3 --ms 10                                                   # proxy + iptables rule
# Wait (bounded) until every namespace shows its process: the backgrounded execs take a moment.
for ((i = 0; i < 200; i++)); do
  pids="" ok=1
  for h in h1 h2 h3 r3 net; do
    p=$(ip netns pids "$(nl ns "$h")" | tr '\n' ' ')
    [[ -n ${p// /} ]] || ok=0
    pids+=" $p"
  done
  ((ok)) && break
  sleep 0.05
done
npids=$(wc -w <<<"$pids")
note "processes in the run: $npids ($pids)"
check "processes were started in 5 namespaces (>= 5 pids)" test "$npids" -ge 5
check "run has 5 namespaces" test "$(ns_of "$name" | wc -l)" -eq 5
check "state directory exists" test -d "/run/netlab/$name"

check "netlab down succeeds" "$NETLAB" --name "$name" down
T_RUN=""
check "no namespaces left" test -z "$(ns_of "$name")"
check "no state directory left" test ! -e "/run/netlab/$name"
left=""
for p in $pids; do alive "$p" && left+=" $p"; done
check "no processes left (were:$pids; alive:${left:- none})" test -z "$left"
snapshot "$T_TMP/after"
check "root namespace links, routes and iptables unchanged" diff "$T_TMP/before" "$T_TMP/after"
check "down again (idempotent) succeeds" "$NETLAB" --name "$name" down

# 2. A failing `up` leaves nothing behind (failure injected after the NAT host is built).
rc=0
NETLAB_TEST_FAIL_AT=host3 "$NETLAB" --name "tdfail$$" up --hosts 4 --nat 2 2>"$T_TMP/fail.err" || rc=$?
check "up with an injected failure exits 1 (got $rc)" test "$rc" -eq 1
check "failed up left no namespaces" test -z "$(ns_of "tdfail$$")"
check "failed up left no state" test ! -e "/run/netlab/tdfail$$"
rc=0
NETLAB_TEST_FAIL_AT=bridge "$NETLAB" --name "tdfail$$" up --hosts 2 2>>"$T_TMP/fail.err" || rc=$?
check "failure right after the bridge also cleans up" test "$rc" -eq 1 -a -z "$(ns_of "tdfail$$")"

# 3. State lost (as after a crash or reboot of /run): down still finds the namespaces.
up --hosts 2 --nat 1
name=$T_RUN
(nl exec h1 -- sleep 1000 </dev/null >/dev/null 2>&1 &)
for ((i = 0; i < 200; i++)); do
  pids=$(ip netns pids "$name-h1" | tr '\n' ' ')
  [[ -n ${pids// /} ]] && break
  sleep 0.05
done
check "the process entered h1's namespace" test -n "${pids// /}"
rm -rf "/run/netlab/$name"
rc=0
"$NETLAB" --name "$name" up --hosts 1 2>/dev/null || rc=$?
check "up refuses a name whose namespaces are still there" test "$rc" -ne 0
check "down without state succeeds" "$NETLAB" --name "$name" down
T_RUN=""
check "leftover namespaces removed" test -z "$(ns_of "$name")"
left=""
for p in $pids; do alive "$p" && left+=" $p"; done
check "leftover processes killed" test -z "$left"
snapshot "$T_TMP/after2"
check "root namespace still unchanged" diff "$T_TMP/before" "$T_TMP/after2"
finish
