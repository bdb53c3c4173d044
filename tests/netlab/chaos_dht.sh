#!/usr/bin/env bash
# The chaos runner driving real `starling dht` nodes on a netlab internet (root): a bootstrap
# node on h1, four peers (one behind NAT in client mode), 20 Mbit/s links; peers are SIGKILLed
# and restarted on a seeded schedule. Every peer keeps writing its sub-key into one shared
# dictionary and reading the whole dictionary back. Checks: no crash or hang (the runner's own
# verdicts); after a settle phase without kills, the last view of every peer holds the sub-key
# of every peer (records written by nodes that were later killed survive on their replicas)
# and all views agree; the namespaces are gone afterwards.
source "$(dirname "$0")/lib.sh"
STARLING=${STARLING:-$T_SRC/build/bin/starling}
[[ -x $STARLING ]] || { echo "no starling binary at $STARLING"; exit 1; }
need_cmd ss
need_root --nat
export CHAOS_QUIET=1

# peer.sh I ADDR PORT BOOT_ADDR BOOT_PORT DIR CLIENT: a DHT node plus a put/get loop. A client
# (NATed) node cannot be dialed, so its put/get go through the bootstrap. The get is a plain one
# (it merges the first three answers): a node that joins after a sub-key was written (or
# restarts with an empty store) receives the existing records from the closest holders
# (replication on join, docs/dht.md), so no replica it reaches is left with a partial dictionary.
# Each run puts its sub-key once (TTL 600 s) and then reads in a loop: every CLI call is a
# process that loads libtorch and joins the DHT, ~2 s at load 10, so the settle phase (12 s)
# leaves room for several reads after the last restart.
cat >"$T_TMP/peer.sh" <<EOF2
#!/usr/bin/env bash
i=\$1 addr=\$2 port=\$3 boot=/ip4/\$4/tcp/\$5 dir=\$6 client=\$7
S=$STARLING
mkdir -p "\$dir"
if [[ \$client == 1 ]]; then
  "\$S" dht --client --identity "\$dir/id.key" --initial-peers "\$boot" &
  via=\$boot
else
  "\$S" dht --identity "\$dir/id.key" --listen /ip4/\$addr/tcp/\$port --initial-peers "\$boot" &
  via=/ip4/\$addr/tcp/\$port
fi
until "\$S" dht put chaos-members alive --subkey "p\$i" --ttl 600 --initial-peers "\$via" >/dev/null 2>&1; do
  sleep 0.3
done
while :; do
  if "\$S" dht get chaos-members --initial-peers "\$via" > "\$dir/get.out" 2>&1; then
    echo "view \$(grep -o 'subkey "p[0-9]*"' "\$dir/get.out" | tr -dc 'p0-9\n' | sort | tr '\n' ' ')"
  fi
  sleep 0.3
done
EOF2

cat >"$T_TMP/dht.conf" <<CONF
hosts = 5
nat = 1
up_mbit = 20
down_mbit = 20
peers = 4
duration_s = 24
settle_s = 12
seed = 5
kill_every_s = 3
restart_after_s = 1
max_dead = 2
term_grace_s = 5
bootstrap_cmd = exec $STARLING dht --identity {peer_dir}/id.key --listen /ip4/{addr}/tcp/{port}
bootstrap_ready = ss -Hltn "sport = :{bootstrap_port}" | grep -q .
peer_cmd = c=0; [ {i} = {peers} ] && c=1; exec bash $T_TMP/peer.sh {i} {addr} {port} {bootstrap_addr} {bootstrap_port} {peer_dir} \$c
check_cmd = bash $T_TMP/check.sh {peers}
CONF

# The agreement check: the last view of each peer (its last run's log) lists p1..pN.
cat >"$T_TMP/check.sh" <<'EOF2'
n=$1
want=$(seq 1 "$n" | sed 's/^/p/' | sort | tr '\n' ' ')
status=0
for i in $(seq 1 "$n"); do
  last=$(ls logs/p$i.*.log | sort -t. -k2 -n | tail -1)
  view=$(grep '^view ' "$last" | tail -1 | cut -d' ' -f2-)
  echo "p$i ($last): ${view:-no view}"
  [[ "$view" == "$want" ]] || { echo "p$i disagrees: wants '$want'"; status=1; }
done
[[ $status == 0 ]] && echo agreed
exit $status
EOF2

run_chaos "$T_TMP/dht.conf" "starling dht collaboration" "peers were killed and restarted" \
  "every peer's last view holds every peer's record"
finish
