#!/usr/bin/env bash
# Round-time overhead of accountability (AccountabilityConfig, docs/security.md) without
# attackers: bench_allreduce among N processes on loopback, the same vector, alternately with
# --verify 0 (the anchor) and --verify 1, PAIRS times each (interleaved, so load drifts hit
# both), every round with CenteredClip at the owners. A round's time is the slowest process's;
# the table shows the median round time of each and their ratio, the busiest process's CPU
# seconds per round (median; robust to load) and their ratio, the bytes each member sends per
# round, and the load average. Ends with one `RESULT {json}` line.
# Environment: ACCT_SIZE (5), ACCT_ELEMS (4194304: 16 MiB), ACCT_ITERS (3), ACCT_PAIRS (2),
# ACCT_AGGREGATION (centered-clip).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
star=$build/bin/bench_allreduce
[[ -x $star ]] || { echo "missing $star (build bench_allreduce first)" >&2; exit 1; }
n=${ACCT_SIZE:-5}
elems=${ACCT_ELEMS:-4194304}
iters=${ACCT_ITERS:-3}
pairs=${ACCT_PAIRS:-2}
agg=${ACCT_AGGREGATION:-centered-clip}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# run VERIFY OUT: one group of n processes; appends its per-round times (slowest process) and
# the bytes rank 0 sent per round to OUT.times / OUT.bytes.
run() {
  local verify=$1 out=$2 d
  d=$(mktemp -d "$tmp/run.XXXX")
  pids=()
  for r in $(seq 0 $((n - 1))); do
    timeout 600 "$star" --rank "$r" --size "$n" --dir "$d/dir" --elems "$elems" --iters "$iters" \
      --aggregation "$agg" --verify "$verify" > "$d/out.$r" 2> "$d/err.$r" &
    pids+=($!)
  done
  local fail=0
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  pids=()
  if ((fail)); then
    echo "a bench_allreduce process failed (verify $verify):" >&2
    tail -n 5 "$d"/err.* >&2
    exit 1
  fi
  jq -s '[.[].allreduce_times_s] | transpose | map(max) | .[]' "$d"/out.* >> "$out.times"
  jq '.bytes_sent_per_round' "$d/out.0" >> "$out.bytes"
  jq -s '[.[].cpu_per_round_s] | transpose | map(max) | .[]' "$d"/out.* >> "$out.cpu"
}

median() { sort -g "$1" | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }

load0=$(cut -d' ' -f1-3 /proc/loadavg)
for _ in $(seq "$pairs"); do
  run 0 "$tmp/plain"
  run 1 "$tmp/acct"
done
plain=$(median "$tmp/plain.times")
acct=$(median "$tmp/acct.times")
ratio=$(awk -v a="$acct" -v p="$plain" 'BEGIN{printf "%.3f", a / p}')
pc=$(median "$tmp/plain.cpu")
ac=$(median "$tmp/acct.cpu")
cpu_ratio=$(awk -v a="$ac" -v p="$pc" 'BEGIN{printf "%.3f", a / p}')
pb=$(median "$tmp/plain.bytes")
ab=$(median "$tmp/acct.bytes")
load1=$(cut -d' ' -f1-3 /proc/loadavg)
echo "accountability overhead: $n processes, $((elems * 4 / 1048576)) MiB, $agg, $((pairs * iters)) rounds each"
printf '  %-28s %12s %12s %16s\n' run "median s" "cpu s" "bytes sent/round"
printf '  %-28s %12s %12s %16s\n' "without (anchor)" "$plain" "$pc" "$pb"
printf '  %-28s %12s %12s %16s\n' "with accountability" "$acct" "$ac" "$ab"
echo "  ratio with/without: time $ratio, cpu $cpu_ratio   load before: $load0   after: $load1"
echo "RESULT {\"bench\":\"acct_overhead\",\"size\":$n,\"bytes\":$((elems * 4)),\"aggregation\":\"$agg\",\"plain_s\":$plain,\"acct_s\":$acct,\"ratio\":$ratio,\"plain_cpu_s\":$pc,\"acct_cpu_s\":$ac,\"cpu_ratio\":$cpu_ratio,\"plain_bytes\":$pb,\"acct_bytes\":$ab,\"load_before\":\"$load0\",\"load_after\":\"$load1\"}"
