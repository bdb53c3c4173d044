#!/usr/bin/env bash
# The benchmark hooks of `starling train` (bench/time_to_accuracy.sh):
#  - --start-barrier DIR: two trainers (alone, no network) each create DIR/ready.<pid> and do
#    not train until DIR/go exists; then both finish, their clocks started after it;
#  - --eval-pause-file FILE: the processes FILE lists are stopped while the trainer evaluates
#    and continued after: a bash process that counts its SIGCONTs sees one per evaluation, and
#    is not left stopped.
# Usage: bench_hooks.sh BUILD_DIR
set -euo pipefail
bin=$1/bin/starling
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/bootstrap_node.sh"
demo_workdir
bar="$dir/barrier"
mkdir -p "$bar"
declare -A tpid
t0=$(date +%s)
for i in 0 1; do
  "$bin" train --identity "$dir/t$i.key" --run-id hooks$i --target-batch-size 256 --batch-size 64 \
    --threads 1 --max-epochs 2 --no-metrics --start-barrier "$bar" --report "$dir/t$i.json" \
    > "$dir/t$i.log" 2>&1 &
  tpid[$i]=$!
  pids+=("${tpid[$i]}")
done
for _ in $(seq 600); do
  (($(find "$bar" -name 'ready.*' | wc -l) >= 2)) && break
  sleep 0.1
done
(($(find "$bar" -name 'ready.*' | wc -l) == 2)) || { echo "FAIL: the trainers never got ready"; exit 1; }
sleep 1  # ready and waiting: neither may train meanwhile
for i in 0 1; do
  kill -0 "${tpid[$i]}" || { echo "FAIL: trainer $i did not wait for go"; exit 1; }
  [[ ! -e $dir/t$i.json ]] || { echo "FAIL: trainer $i reported before go"; exit 1; }
done
go=$(date +%s.%N)
touch "$bar/go"
wait_trainers 120 "$t0" 0 1
for i in 0 1; do
  s=$(sed -n 's/.*"started_unix":\([0-9.e+]*\).*/\1/p' "$dir/t$i.json")
  awk -v s="$s" -v g="$go" 'BEGIN{ exit !(s >= g - 0.05) }' ||
    { echo "FAIL: trainer $i started its clock at $s, before go at $go"; exit 1; }
done
echo "start barrier: both waited for go and started their clocks after it"

# A process that counts the SIGCONTs it receives.
bash -c "trap 'echo cont >> \"$dir/conts\"' CONT; while :; do sleep 0.01; done" &
other=$!
pids+=("$other")
echo "$other" > "$dir/pause"
"$bin" train --identity "$dir/t2.key" --run-id hooks2 --target-batch-size 256 --batch-size 64 \
  --threads 1 --max-epochs 3 --eval-every 1 --no-metrics --eval-pause-file "$dir/pause" \
  > "$dir/t2.log" 2>&1
evals=$(grep -c "^epoch [0-9]*: test accuracy" "$dir/t2.log")
sleep 0.2
conts=$(wc -l < "$dir/conts" 2>/dev/null || echo 0)
state=$(awk '{print $3}' "/proc/$other/stat")
echo "eval pause: $evals evaluations, $conts continues, the other process in state $state"
((evals == 3)) || { echo "FAIL: expected 3 evaluations"; exit 1; }
((conts == evals)) || { echo "FAIL: expected one stop and continue per evaluation"; exit 1; }
[[ $state != T ]] || { echo "FAIL: the other process was left stopped"; exit 1; }
echo "PASS: start barrier and evaluation pause"
