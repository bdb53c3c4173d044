#!/usr/bin/env bash
# A late starter: 3 `starling train` peers start together, a 4th DELAY seconds later (MLP,
# target 1024, batch 64, 1 thread, EPOCHS epochs). Prints per trainer the rounds it took part
# in, its state downloads and the samples it computed and dropped (computed toward an epoch the
# collaboration left without it: OptimizerStatus::samples_dropped), and the load.
# Usage: bench/late_starter.sh BIN [DELAY] [EPOCHS]   (env LATE_KEEP=DIR keeps the logs)
set -euo pipefail
bin=$1
delay=${2:-1}
epochs=${3:-60}
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap_node.sh"
demo_workdir
[[ -n ${LATE_KEEP:-} ]] && trap 'demo_cleanup; mkdir -p "$LATE_KEEP"; cp -r "$dir"/. "$LATE_KEEP"/ 2>/dev/null || true' EXIT
load0=$(cut -d' ' -f1-3 /proc/loadavg)
start_bootstrap "$bin" "$dir"
declare -A tpid
t0=$(date +%s)
for i in 0 1 2 3; do
  ((i == 3)) && sleep "$delay"
  STARLING_LOG=info "$bin" train --identity "$dir/t$i.key" --initial-peers "$boot" \
    --listen /ip4/127.0.0.1/tcp/0 --run-id late --target-batch-size 1024 --batch-size 64 \
    --threads 1 --max-epochs "$epochs" --linger 3 --averaging-timeout 15 --no-metrics \
    --report "$dir/t$i.json" > "$dir/t$i.log" 2>&1 &
  tpid[$i]=$!
  pids+=("${tpid[$i]}")
done
wait_trainers 300 "$t0" 0 1 2 3
field() { sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" "$1"; }
echo "late starter: 3 trainers, a 4th $delay s later, $epochs epochs; load before $load0, after $(cut -d' ' -f1 /proc/loadavg)"
printf '  %-8s %7s %10s %10s %16s\n' trainer rounds downloads samples "samples dropped"
for i in 0 1 2 3; do
  f=$dir/t$i.json
  printf '  %-8s %7s %10s %10s %16s\n' "t$i" "$(field "$f" rounds_ok)" "$(field "$f" state_downloads)" \
    "$(field "$f" samples)" "$(field "$f" samples_dropped)"
done
