#!/usr/bin/env bash
# Five `starling train` peers of one run started in the same instant on loopback. Each one's
# first fetch of the others' progress shows only the records published before it; a majority
# of such a partial view once let two disjoint groups both average epoch 0 (a fork, healed by
# a download later). Checks: no epoch has two digests across the trainers, no trainer logs a
# fork, the first round has a majority of all five (3 or more members), and all five end with
# identical parameters.
# Usage: simultaneous_start.sh BUILD_DIR
set -euo pipefail
bin=$1/bin/starling
EPOCHS=${EPOCHS:-12}
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/bootstrap_node.sh"
demo_workdir
start_bootstrap "$bin" "$dir"
declare -A tpid
t0=$(date +%s)
for i in 0 1 2 3 4; do
  STARLING_LOG=info "$bin" train --identity "$dir/t$i.key" --initial-peers "$boot" \
    --listen /ip4/127.0.0.1/tcp/0 --run-id simultaneous --target-batch-size 1024 \
    --batch-size 32 --threads 1 --max-epochs "$EPOCHS" --linger 10 --averaging-timeout 15 \
    --report "$dir/t$i.json" > "$dir/t$i.log" 2>&1 &
  tpid[$i]=$!
  pids+=("${tpid[$i]}")
done
wait_trainers 240 "$t0" 0 1 2 3 4
grep -hoE 'epoch [0-9]+ -> [0-9]+: .* digest [0-9a-f]+' "$dir"/t?.log |
  awk '{print $4, $NF}' | sed 's/://' | sort -u > "$dir/digests"
forks=$(awk '{print $1}' "$dir/digests" | uniq -d | tr '\n' ' ')
epochs=$(awk '{print $1}' "$dir/digests" | sort -u | wc -l)
echo "epochs with logged digests: $epochs; epochs with two or more digests: ${forks:-none}"
grep -h "epoch 0 -> 1" "$dir"/t?.log | sed 's/^.*epoch/epoch/' || true
fail=0
[[ -z $forks ]] || { echo "FAIL: forked at epoch(s) $forks"; fail=1; }
if grep -l "parameters forked" "$dir"/t?.log; then echo "FAIL: a trainer saw a fork"; fail=1; fi
first=$(grep -hoE 'epoch 0 -> 1: averaged \(group [0-9]+' "$dir"/t?.log | grep -oE '[0-9]+$' |
  sort -n | head -1)
[[ ${first:-0} -ge 3 ]] || { echo "FAIL: a first round of ${first:-no} members (< 3 of 5)"; fail=1; }
hashes=$(sed -nE 's/.*"param_hash":"?([^,"}]*).*/\1/p' "$dir"/t?.json | sort -u | wc -l)
[[ $hashes -eq 1 ]] || { echo "FAIL: $hashes different final parameter hashes"; fail=1; }
((fail == 0)) && echo "PASS: five simultaneous starts, one digest per epoch, identical parameters"
exit $fail
