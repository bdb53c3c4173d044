#!/usr/bin/env bash
# make demo-moe: a decentralized mixture of experts on loopback (docs/moe.md). A `starling dht`
# bootstrap node, 2 `starling experts serve` processes (16 FFN experts on a 4x4 grid, 8 each;
# server 2 checkpoints its experts) and 3 `starling train --task fashion-moe` trainers whose
# trunk is averaged by the collaborative optimizer. Once the collaboration reaches KILL_AT
# epochs, server 2 is SIGKILLed and server 3 starts on its checkpoint directory (its experts
# come back restored), and server 4 starts as a replica of server 1 (it downloads the state of
# server 1's experts through the state transfer; from then on servers 1 and 4 average their
# replicas' parameters every 2 s). At the end: each trainer's test accuracy, its failed expert
# calls survived, expert utilisation, and the parameter hashes of the trunks.
# Exits non-zero if a check fails: every trainer at least ACC test accuracy, identical trunks,
# server 3 restored the experts, server 4 downloaded them and averaged them with server 1, the
# stage under LIMIT seconds.
# Usage: scripts/demo_moe.sh [BUILD]   (tunables: EPOCHS, TARGET, KILL_AT, ACC, LIMIT)
set -euo pipefail
build=${1:-build}
bin=$build/bin/starling
epochs=${EPOCHS:-150}
target=${TARGET:-1024}
kill_at=${KILL_AT:-$((epochs / 3))}
acc_min=${ACC:-0.82}
limit=${LIMIT:-300}
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap_node.sh"
demo_workdir
t0=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)

echo "== DMoE on Fashion-MNIST: a DHT bootstrap node, 2 expert servers, 3 trainers (target batch $target, $epochs epochs)"
start_bootstrap "$bin" "$dir"
echo "   bootstrap node: $boot"

declare -A spid
start_server() {
  local i=$1 experts=$2
  shift 2
  "$bin" experts serve --experts "$experts" --dim 64 --hidden-dim 128 --lr 1e-3 \
    --initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 --declare-period 2 "$@" \
    > "$dir/s$i.log" 2>&1 &
  spid[$i]=$!
  pids+=("${spid[$i]}")
  for _ in $(seq 300); do grep -q '^serving' "$dir/s$i.log" && break; sleep 0.1; done
  grep -q '^serving' "$dir/s$i.log" || { echo "server $i did not start"; cat "$dir/s$i.log"; exit 1; }
  echo "   server $i (pid ${spid[$i]}): $(grep '^serving' "$dir/s$i.log")"
}
start_server 1 'ffn.[0:2].[0:4]' --share-state --average-period 2
start_server 2 'ffn.[2:4].[0:4]' --checkpoint-dir "$dir/ckpt" --checkpoint-period 2

declare -A tpid
for i in 1 2 3; do
  STARLING_LOG=${STARLING_LOG:-warn} "$bin" train --task fashion-moe --identity "$dir/t$i.key" \
    --initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 --batch-size 64 \
    --target-batch-size "$target" --threads 1 --max-epochs "$epochs" --progress-every 1 \
    --metrics-interval 2 --report "$dir/t$i.json" > "$dir/t$i.log" 2>&1 &
  tpid[$i]=$!
  pids+=("${tpid[$i]}")
  echo "   trainer $i started (pid ${tpid[$i]})"
done
epoch_of() { { grep -ao '^epoch [0-9]*' "$dir/t$1.log" 2>/dev/null || true; } | tail -1 | awk '{print $2+0}'; }
while :; do
  e=$(epoch_of 1); e=${e:-0}
  (( e >= kill_at )) && break
  kill -0 "${tpid[1]}" 2>/dev/null || { echo "trainer 1 exited early"; cat "$dir/t1.log"; exit 1; }
  (( $(date +%s) - t0 > limit )) && { echo "no progress before the time limit"; exit 1; }
  sleep 1
done
grep -m1 '^peer' "$dir/t1.log" | sed 's/^peer [^ ]* run [^ ]* /   task: /'
echo "== epoch $e: SIGKILL server 2; server 3 starts on its checkpoint directory"
kill -9 "${spid[2]}"
wait "${spid[2]}" 2>/dev/null || true
start_server 3 'ffn.[2:4].[0:4]' --checkpoint-dir "$dir/ckpt" --checkpoint-period 2
restored=$(sed -n 's/^restored \([0-9]*\) experts.*/\1/p' "$dir/s3.log")
echo "   server 3 restored ${restored:-0} experts from server 2's checkpoints"
echo "== server 4 starts as a replica of server 1 and downloads its experts' state"
start_server 4 'ffn.[0:2].[0:4]' --download-state --average-period 2
downloaded=$(sed -n 's/^downloaded \([0-9]*\) experts.*/\1/p' "$dir/s4.log")
echo "   server 4 downloaded ${downloaded:-0} experts' state from server 1"

wait_trainers "$limit" "$t0" 1 2 3
for i in 1 3 4; do kill -INT "${spid[$i]}" 2>/dev/null || true; done
kill -INT "$boot_pid" 2>/dev/null || true
secs=$(($(date +%s) - t0))
load1=$(cut -d' ' -f1-3 /proc/loadavg)

echo "== results"
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$dir/t$1.json" | tr -d '"'; }
ok=1
hashes=()
printf '   %-4s %-11s %6s %9s %8s %14s %14s %s\n' peer stop epoch accuracy samples \
  "fwd failed" "bwd failed" trunk_hash
for i in 1 2 3; do
  [[ -s $dir/t$i.json ]] || { echo "   t$i: no report"; ok=0; continue; }
  acc=$(field "$i" test_accuracy)
  line=$(grep '^moe: forward' "$dir/t$i.log" || true)
  fc=$(sed -n 's/.*forward calls \([0-9]*\) failed \([0-9]*\).*/\2\/\1/p' <<< "$line")
  bc=$(sed -n 's/.*backward calls \([0-9]*\) failed \([0-9]*\).*/\2\/\1/p' <<< "$line")
  printf '   %-4s %-11s %6s %9.4f %8s %14s %14s %s\n' "t$i" "$(field "$i" stop)" \
    "$(field "$i" epoch)" "$acc" "$(field "$i" samples)" "$fc" "$bc" "$(field "$i" param_hash)"
  awk -v a="$acc" -v m="$acc_min" 'BEGIN { exit !(a >= m) }' ||
    { echo "   t$i: test accuracy $acc is below $acc_min"; ok=0; }
  hashes+=("$(field "$i" param_hash)")
done
echo "   expert utilisation seen by trainer 1 (share of the rows it routed):"
sed -n 's/^moe utilisation: //p' "$dir/t1.log" | fold -w 92 -s | sed 's/^/     /'
sleep 1
for i in 1 3 4; do echo "   server $i: $(grep '^stopped' "$dir/s$i.log" || echo 'no stop line')"; done
echo "   server 2: SIGKILLed at epoch $e"
if [[ $(printf '%s\n' "${hashes[@]}" | sort -u | wc -l) == 1 && ${#hashes[@]} == 3 ]]; then
  echo "   all trainers hold identical trunks: ${hashes[0]}"
else
  echo "   trunk hashes differ"; ok=0
fi
(( ${restored:-0} > 0 )) || { echo "   server 3 restored no expert"; ok=0; }
(( ${downloaded:-0} > 0 )) || { echo "   server 4 downloaded no expert state"; ok=0; }
averaged=$(sed -n 's/^stopped.*replica averages \([0-9]*\).*/\1/p' "$dir/s4.log")
(( ${averaged:-0} > 0 )) || { echo "   server 4 never averaged its experts with server 1"; ok=0; }
echo "   demo-moe: ${secs} s (limit ${limit} s); load average before ${load0}, after ${load1}"
(( secs < limit )) || ok=0
(( ok == 1 )) || { echo "== demo-moe: a check failed"; exit 1; }
echo "== demo-moe: all checks passed"
