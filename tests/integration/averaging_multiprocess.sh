#!/usr/bin/env bash
# Averaging across processes on loopback: N averaging_node processes meet through a
# FileDirectory (matchmaking, no coordinator) and run two steps. Step 0: every process must
# succeed with the whole group, hold identical bytes, and match the exact weighted mean. Step 1:
# the last process crashes (exits abruptly) when it enters PHASE; every survivor must succeed
# with identical bytes within the step deadline. Every wait is bounded (timeout per process).
# Usage: averaging_multiprocess.sh BIN [N] [PHASE] [CODEC]
set -euo pipefail
bin=$1
n=${2:-4}
phase=${3:-reduce-scatter}
codec=${4:-none}
source "$(dirname "$0")/../../scripts/lib/run.sh"
st_init
mkdir -p "$dir/directory"
for i in $(seq 0 $((n - 1))); do
  extra=()
  ((i == n - 1)) && extra=(--die-at "$phase")
  timeout 240 "$bin" --index "$i" --peers "$n" --dir "$dir/directory" --steps 2 --codec "$codec" \
    "${extra[@]}" > "$dir/out.$i" 2> "$dir/err.$i" &
  pids+=($!)
done
fail=0
for i in $(seq 0 $((n - 1))); do
  rc=0
  wait "${pids[$i]}" || rc=$?
  if ((i == n - 1)); then
    [[ $rc == 9 ]] || { echo "process $i: exit $rc, expected the crash (9)"; fail=1; }
  elif ((rc != 0)); then
    echo "process $i: exit $rc"
    fail=1
  fi
done
pids=()
if ((fail)); then tail -n 20 "$dir"/err.* "$dir"/out.*; exit 1; fi
cat "$dir"/out.*
all=$(cat "$dir"/out.* | jq -s '.')
# Step 0: everyone, whole group, one hash, exact mean.
jq -e --argjson n "$n" '[.[] | select(.step == 0)] | length == $n and all(.ok and .group == $n)
  and (map(.hash) | unique | length == 1)' <<< "$all" > /dev/null ||
  { echo "step 0: not every process averaged with the whole group to identical bytes"; exit 1; }
tol=$([[ $codec == none ]] && echo 1e-4 || echo 0.1)
jq -e --argjson t "$tol" '[.[] | select(.step == 0) | .max_error] | all(. <= $t)' <<< "$all" \
  > /dev/null || { echo "step 0: result is not the weighted mean"; exit 1; }
# Step 1: the survivors all succeed with identical bytes.
jq -e --argjson n "$n" '[.[] | select(.step == 1)] | length == $n - 1 and all(.ok)
  and (map(.hash) | unique | length == 1)' <<< "$all" > /dev/null ||
  { echo "step 1: survivors of the crash disagree or failed"; exit 1; }
echo "averaging_multiprocess ($n processes, crash in $phase, codec $codec): ok"
