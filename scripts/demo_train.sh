#!/usr/bin/env bash
# The training stage of make demo: a `starling dht` bootstrap node and 4 `starling train`
# processes on loopback train the Fashion-MNIST MLP together. Once the collaboration reaches
# KILL_AT epochs, trainer 2 is SIGKILLed and trainer 5 joins (it downloads the state from the
# others and catches up). At the end: test accuracy, samples and bytes per peer, and the check
# that every live peer holds identical parameters (same hash in its --report). Trainer 1
# evaluates every 5 epochs: its time to test accuracy 0.85 is printed beside one process
# training alone with the same recipe, run right after in this script. Exits non-zero if a
# target fails: accuracy >= 0.85, identical hashes, the stage under 10 minutes.
# Usage: scripts/demo_train.sh BIN WORKDIR   (tunables: EPOCHS, TARGET, LR, KILL_AT, DELAY_STEP=0|1)
set -euo pipefail
bin=$1
dir=$2
epochs=${EPOCHS:-180}
target=${TARGET:-1024}
lr=${LR:-0.003}
kill_at=${KILL_AT:-$((epochs / 3))}
delay_flag=()
[[ ${DELAY_STEP:-0} == 1 ]] && delay_flag=(--delay-step)
limit=600
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
t0=$(date +%s)

echo "== collaborative training: a DHT bootstrap node and 4 trainers (MLP, target batch $target, $epochs epochs${delay_flag:+, delayed updates})"
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap_node.sh"
start_bootstrap "$bin" "$dir"
echo "   bootstrap node: $boot"

declare -A tpid
start_trainer() {
  local i=$1 eval_flags=()
  [[ $i == 1 ]] && eval_flags=(--eval-every 5 --target-accuracy 0.85)
  STARLING_LOG=${STARLING_LOG:-info} "$bin" train --identity "$dir/t$i.key" --initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 \
    --run-id demo --target-batch-size "$target" --batch-size 64 --threads 1 --lr "$lr" \
    --max-epochs "$epochs" "${delay_flag[@]}" --progress-every 20 --report "$dir/t$i.json" "${eval_flags[@]}" > "$dir/t$i.log" 2>&1 &
  tpid[$i]=$!
  pids+=("${tpid[$i]}")
  echo "   trainer $i started (pid ${tpid[$i]})"
}
epoch_of() { { grep -ao 'epoch [0-9]*' "$dir/t$1.log" 2>/dev/null || true; } | tail -1 | awk '{print $2+0}'; }
for i in 1 2 3 4; do start_trainer "$i"; done

while :; do
  e=$(epoch_of 1); e=${e:-0}
  (( e >= kill_at )) && break
  kill -0 "${tpid[1]}" 2>/dev/null || { echo "trainer 1 exited early"; cat "$dir/t1.log"; exit 1; }
  (( $(date +%s) - t0 > limit )) && { echo "no progress before the time limit"; exit 1; }
  sleep 2
done
echo "== epoch $e: SIGKILL trainer 2; trainer 5 joins"
kill -9 "${tpid[2]}"
start_trainer 5

live=(1 3 4 5)
wait_trainers "$limit" "$t0" "${live[@]}"
kill -INT "$boot_pid" 2>/dev/null || true
secs=$(($(date +%s) - t0))

echo "== results"
printf '   %-8s %-12s %8s %10s %12s %8s %s\n' peer stop epoch accuracy samples "MB sent" param_hash
ok=1
hashes=()
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$dir/t$1.json" | tr -d '"'; }
printf '   %-8s %-12s\n' "t2" "SIGKILLed"
for i in "${live[@]}"; do
  [[ -s $dir/t$i.json ]] || { echo "   t$i: no report"; ok=0; continue; }
  acc=$(field "$i" test_accuracy)
  printf '   %-8s %-12s %8s %10.4f %12s %8.1f %s\n' "t$i" "$(field "$i" stop)" "$(field "$i" epoch)" \
    "$acc" "$(field "$i" samples)" "$(awk -v b="$(field "$i" bytes_sent)" 'BEGIN{print b/1e6}')" \
    "$(field "$i" param_hash)"
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.85) }' || { echo "   t$i: accuracy $acc below 0.85"; ok=0; }
  hashes+=("$(field "$i" param_hash)")
done
downloads=$(field 5 state_downloads)
echo "   joiner t5 state downloads: ${downloads:-0}"
if [[ $(printf '%s\n' "${hashes[@]}" | sort -u | wc -l) == 1 && ${#hashes[@]} == 4 ]]; then
  echo "   all live peers hold identical parameters: ${hashes[0]}"
else
  echo "   parameter hashes differ"; ok=0
fi
echo "   training stage: ${secs} s (limit ${limit} s)"
# Time to 0.85: trainer 1 (the collaboration, churn included) against one process alone.
"$bin" train --identity "$dir/alone.key" --run-id demo-alone --target-batch-size "$target" \
  --batch-size 64 --threads 1 --lr "$lr" "${delay_flag[@]}" --eval-every 5 --target-accuracy 0.85 \
  --stop-at-target --max-seconds 120 --report "$dir/alone.json" > "$dir/alone.log" 2>&1 || true
reached() {
  local s e ev
  s=$(sed -n 's/.*"target_reached_seconds":\([0-9.e+-]*\).*/\1/p' "$1")
  e=$(sed -n 's/.*"target_reached_epoch":\([0-9]*\).*/\1/p' "$1")
  ev=$(sed -n 's/.*"target_reached_eval_seconds":\([0-9.e+-]*\).*/\1/p' "$1")
  if [[ -n $s ]]; then printf '%.1f s at epoch %s (%.1f s of it evaluating)' "$s" "$e" "$ev"; else echo "not reached"; fi
}
echo "   time to test accuracy 0.85: collaboration (trainer 1) $(reached "$dir/t1.json"); one process alone $(reached "$dir/alone.json")"
(( secs < limit )) || ok=0
(( ok == 1 )) || { echo "== demo: a target check failed"; exit 1; }
