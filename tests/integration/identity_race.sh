#!/usr/bin/env bash
# Two `starling train` peers of one run with different task identities (model seeds 0 and 1:
# the same shapes, so their rounds would average silently), started in the same instant:
# exactly one must leave with exit code 2 and the identity message (at start if the other's
# metrics record was already there, else from the periodic check: the younger leaves), while
# the other trains on to --max-seconds and exits 0 without such a message.
# Usage: identity_race.sh BUILD_DIR
set -euo pipefail
bin=$1/bin/starling
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/bootstrap_node.sh"
demo_workdir
start_bootstrap "$bin" "$dir"
declare -A tpid
for i in 0 1; do
  "$bin" train --identity "$dir/t$i.key" --initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 \
    --run-id race --model-seed "$i" --target-batch-size 256 --batch-size 32 --threads 1 \
    --metrics-interval 0.5 --max-seconds 25 --progress-every 5 > "$dir/t$i.log" 2>&1 &
  tpid[$i]=$!
  pids+=("${tpid[$i]}")
done
# The first to exit must be the refused one (well before --max-seconds).
set +e
wait -n -p first "${tpid[0]}" "${tpid[1]}"
rc=$?
set -e
loser=0; [[ $first == "${tpid[1]}" ]] && loser=1
winner=$((1 - loser))
echo "trainer $loser exited first with $rc"
grep -h "error:" "$dir/t$loser.log" || true
[[ $rc == 2 ]] || { echo "FAIL: expected exit code 2 (identity refused)"; tail -20 "$dir/t$loser.log"; exit 1; }
grep -q "differ" "$dir/t$loser.log" || { echo "FAIL: no identity message"; exit 1; }
if timeout 60 tail --pid="${tpid[$winner]}" -f /dev/null; then :; else
  echo "FAIL: trainer $winner did not stop at --max-seconds"; exit 1
fi
set +e
wait "${tpid[$winner]}"
rc=$?
set -e
echo "trainer $winner exited with $rc"
[[ $rc == 0 ]] || { echo "FAIL: the other trainer failed"; tail -20 "$dir/t$winner.log"; exit 1; }
if grep -q "differ" "$dir/t$winner.log"; then echo "FAIL: both were refused"; exit 1; fi
grep -h "^done:" "$dir/t$winner.log"
echo "PASS: exactly one of two mismatched trainers left"
