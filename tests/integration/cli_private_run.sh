#!/usr/bin/env bash
# A private run through the command line: the organiser's run key and certificates
# (`starling run-key`), two `starling train` members with --run-key/--membership training
# together, an outsider with the run's name but no certificate that never averages with them,
# and a peer started with another peer's certificate, which refuses to start.
set -euo pipefail
bin=$(realpath "$1")
source "$(dirname "$0")/../../scripts/bootstrap_node.sh"
demo_workdir
start_bootstrap "$bin" "$dir"
run=$("$bin" run-key new --out "$dir/run.key" 2> /dev/null)
for i in 1 2; do
  peer=$("$bin" id -i "$dir/t$i.key" 2> /dev/null)
  "$bin" run-key sign --key "$dir/run.key" --peer "$peer" --out "$dir/t$i.cert" 2> /dev/null
done
"$bin" id -i "$dir/t3.key" > /dev/null 2>&1
common=(--initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 --run-id private --batch-size 64
  --target-batch-size 256 --threads 1 --progress-every 5 --linger 0)
set +e
"$bin" train --identity "$dir/t3.key" "${common[@]}" --max-epochs 1 --run-key "$run" \
  --membership "$dir/t1.cert" > "$dir/wrong.log" 2>&1
rc=$?
set -e
[[ $rc != 0 ]] && grep -q "wrong member" "$dir/wrong.log" ||
  { echo "a peer with another's certificate started (rc $rc)"; cat "$dir/wrong.log"; exit 1; }

declare -A tpid
for i in 1 2; do
  STARLING_LOG=info "$bin" train --identity "$dir/t$i.key" "${common[@]}" --max-epochs 6 \
    --run-key "$run" --membership "$dir/t$i.cert" > "$dir/t$i.log" 2>&1 &
  tpid[$i]=$!
  pids+=("${tpid[$i]}")
done
STARLING_LOG=info "$bin" train --identity "$dir/t3.key" "${common[@]}" --max-seconds 300 \
  > "$dir/t3.log" 2>&1 &
pids+=($!)
wait_trainers 300 "$(date +%s)" 1 2
for i in 1 2; do
  grep -q "^done: epoch 6 " "$dir/t$i.log" || { echo "member $i"; tail -20 "$dir/t$i.log"; exit 1; }
done
h1=$(grep -o 'param_hash [0-9a-f]*' "$dir/t1.log" | tail -1)
h2=$(grep -o 'param_hash [0-9a-f]*' "$dir/t2.log" | tail -1)
[[ -n $h1 && $h1 == "$h2" ]] || { echo "members differ: '$h1' vs '$h2'"; exit 1; }
# Every member round had exactly the two members; the outsider never averaged.
if grep -a "averaged (group" "$dir/t1.log" "$dir/t2.log" | grep -qv "averaged (group 2,"; then
  echo "a member averaged in a group other than the two members"; exit 1
fi
if grep -qa "averaged (group" "$dir/t3.log"; then echo "the outsider averaged"; exit 1; fi
echo "private run: ok ($h1)"
