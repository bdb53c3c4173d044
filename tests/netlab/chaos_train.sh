#!/usr/bin/env bash
# The chaos runner driving real `starling train` processes on a netlab internet (root): a
# `starling dht` bootstrap node on h1 and four trainers on their own hosts (20 Mbit/s links)
# collaborating on Fashion-MNIST; trainers are SIGKILLed and restarted on a seeded schedule
# (a restarted trainer joins with fresh parameters and must download the state). At the end
# everyone gets SIGTERM and writes its report. Checks: no crash or hang (the runner's verdicts);
# the collaboration made progress; every epoch at which two or more trainers stopped holds
# identical parameters on all of them (same parameter hash), so churn never forked the model;
# the namespaces are gone afterwards.
source "$(dirname "$0")/lib.sh"
STARLING=${STARLING:-$T_SRC/build/bin/starling}
[[ -x $STARLING ]] || { echo "no starling binary at $STARLING"; exit 1; }
[[ -s /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
  skip "Fashion-MNIST (dataset-fashion-mnist) is not installed"
need_cmd ss
need_root
export CHAOS_QUIET=1

cat >"$T_TMP/train.conf" <<CONF
hosts = 5
up_mbit = 20
down_mbit = 20
peers = 4
duration_s = 30
settle_s = 20
seed = 7
kill_every_s = 6
restart_after_s = 2
max_dead = 1
term_grace_s = 40
bootstrap_cmd = exec $STARLING dht --identity {peer_dir}/id.key --listen /ip4/{addr}/tcp/{port}
bootstrap_ready = ss -Hltn "sport = :{bootstrap_port}" | grep -q .
peer_cmd = exec $STARLING train --identity {peer_dir}/id.key --listen /ip4/{addr}/tcp/{port} --initial-peers /ip4/{bootstrap_addr}/tcp/{bootstrap_port} --run-id chaos --target-batch-size 512 --batch-size 64 --threads 1 --lr 0.003 --averaging-timeout 10 --progress-every 5 --report {peer_dir}/report.{run}.json
check_cmd = bash $T_TMP/check.sh {peers}
CONF

# The agreement check, on each trainer's report from its last run.
cat >"$T_TMP/check.sh" <<'EOF2'
n=$1
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$1" | tr -d '"'; }
declare -A hash_at count_at
status=0 max_epoch=0
for i in $(seq 1 "$n"); do
  last=$(ls state/p$i/report.*.json 2>/dev/null | sort -t. -k2 -n | tail -1)
  [[ -n $last ]] || { echo "p$i: no report"; status=1; continue; }
  e=$(field "$last" epoch) h=$(field "$last" param_hash)
  echo "p$i ($last): epoch $e hash $h"
  ((e > max_epoch)) && max_epoch=$e
  count_at[$e]=$((${count_at[$e]:-0} + 1))
  if [[ -n ${hash_at[$e]:-} && ${hash_at[$e]} != "$h" ]]; then
    echo "epoch $e: hash $h differs from ${hash_at[$e]}"; status=1
  fi
  hash_at[$e]=$h
done
((max_epoch >= 5)) || { echo "too little progress: max epoch $max_epoch"; status=1; }
[[ $status == 0 ]] && echo agreed
exit $status
EOF2

run_chaos "$T_TMP/train.conf" "starling train collaboration" "trainers were killed and restarted" \
  "trainers that stopped at the same epoch hold identical parameters"
finish
