#!/usr/bin/env bash
# Time to accuracy (part of make bench-training): how soon does a collaboration reach a target
# held-out accuracy, against the same machine training one model alone.
#  - alone: one `starling train` process (no network), the same recipe and threads as each
#    collaborating trainer (MLP, target batch 1024, batch 64, Adam lr 0.003, 1 thread);
#  - per mode (sync, delayed updates, float16 compression, DiLoCo): a `starling dht` bootstrap
#    node and PEERS `starling train` processes; trainer 1 evaluates every EVAL epochs (DiLoCo:
#    every outer epoch) and stops at the first evaluation at or above the target; the others
#    are stopped then. While trainer 1 evaluates, the other trainers are stopped (SIGSTOP,
#    `--eval-pause-file`), so no one computes during the time subtracted below.
# All trainers start their clocks together (`--start-barrier`: each waits, once ready, until
# all are). The time is trainer 1's wall time from its clock's start (after loading the data
# and joining the DHT, as alone's) to that evaluation, evaluations included, and the same minus the time
# trainer 1 spent evaluating ("training s": on this small model one evaluation of the 10,000
# test images costs about as much as 4 epochs, and a real run evaluates elsewhere or rarely).
# Ratios use the training seconds. Also printed: how long after trainer 1's clock the last
# trainer's started (trainer 1 waits for it; reports' `started_unix`). The ideal is alone x (cores used alone) / (cores the peers share) =
# alone / min(PEERS, nproc). A mode that does not reach the target by DEADLINE seconds prints
# "not reached" with its best accuracy and epoch.
# Prints a table and one line `RESULT {json}`.
# Usage: bench/time_to_accuracy.sh BIN [DEADLINE]
#   env: TTA_TARGET (0.85), TTA_PEERS (4), TTA_EVAL (2), TTA_MODES ("sync delayed f16 diloco"; also
#        delayed-stale, delayed-predict, delayed-local: delayed updates with the staleness
#        correction none, predict or local rather than the default; delayed-bounded: delayed
#        updates that wait for a round outlasting one target's share of computing, --max-backlog 1),
#        TTA_DILOCO_STEPS (16), TTA_ALONE_ALT (256: alone again at this target batch, the
#        other side of fairness: DiLoCo's local steps are of 64 samples; empty: not run),
#        TTA_COLLAB_FLAGS (more flags for every collaborating trainer), TTA_KEEP=DIR keeps the logs.
set -euo pipefail
bin=$1
deadline=${2:-180}
target=${TTA_TARGET:-0.85}
k=${TTA_PEERS:-4}
eval_every=${TTA_EVAL:-2}
modes=${TTA_MODES:-sync delayed f16 diloco}
h=${TTA_DILOCO_STEPS:-16}
alt=${TTA_ALONE_ALT-256}
cores=$(nproc)
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if [[ -n ${TTA_KEEP:-} ]]; then mkdir -p "$TTA_KEEP" && cp -r "$dir"/. "$TTA_KEEP"/; fi
  rm -rf "$dir"
}
trap cleanup EXIT
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$1" | tr -d '"'; }
base=(--batch-size 64 --threads 1 --lr 0.003 --linger 0 --no-metrics)
recipe=(--target-batch-size 1024 "${base[@]}")

# best LOG: "accuracy epoch" of the best evaluation printed in a trainer's log.
best() {
  sed -n 's/^epoch \([0-9]*\): test accuracy \([0-9.]*\).*/\2 \1/p' "$1" | sort -rn | head -1
}
# outcome NAME REPORT LOG: prints "seconds epoch eval_seconds" or "- best_acc best_epoch".
outcome() {
  local f=$2
  if [[ -s $f && -n $(field "$f" target_reached_seconds) ]]; then
    echo "$(field "$f" target_reached_seconds) $(field "$f" target_reached_epoch) $(field "$f" target_reached_eval_seconds) $(field "$f" target_reached_cpu_seconds)"
  else
    read -r acc ep < <(best "$3" || true)
    echo "- ${acc:-0} ${ep:-0}"
  fi
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
"$bin" train --identity "$dir/alone.key" --run-id tta-alone "${recipe[@]}" --eval-every "$eval_every" \
  --target-accuracy "$target" --stop-at-target --max-seconds "$deadline" --report "$dir/alone.json" \
  > "$dir/alone.out" 2> "$dir/alone.log" || true
read -r alone_s alone_ep alone_ev _ < <(outcome alone "$dir/alone.json" "$dir/alone.log")
echo "alone $(cut -d' ' -f1 /proc/loadavg)" >> "$dir/loads"
if [[ -n $alt ]]; then
  "$bin" train --identity "$dir/alone.key" --run-id tta-alone-alt "${base[@]}" \
    --target-batch-size "$alt" --eval-every $((eval_every * 1024 / alt)) --target-accuracy "$target" \
    --stop-at-target --max-seconds "$deadline" --report "$dir/alone-alt.json" \
    > "$dir/alone-alt.out" 2> "$dir/alone-alt.log" || true
  read -r alt_s alt_ep alt_ev alt_cpu < <(outcome alone "$dir/alone-alt.json" "$dir/alone-alt.log")
fi

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap_node.sh"
start_bootstrap "$bin" "$dir"

# collab MODE FLAGS...: PEERS trainers; trainer 1 evaluates and stops at the target.
collab() {
  local m=$1; shift
  local ps=() ev=$eval_every bar="$dir/$m.barrier"
  mkdir -p "$bar"
  [[ $m == diloco ]] && ev=1
  for i in $(seq "$k"); do
    local extra=()
    # While trainer 1 evaluates, the others are stopped (SIGSTOP): otherwise they would
    # compute on both cores meanwhile and that computing would escape "training s"
    # (TTA_PAUSE=0: not stopped, the figures before 2026-11-29 21:40).
    ((i == 1)) && extra=(--eval-every "$ev" --target-accuracy "$target" --stop-at-target
      --eval-pause-file "$dir/$m.pause")
    STARLING_LOG=${TTA_LOG:-warn} "$bin" train --identity "$dir/$m$i.key" --run-id "tta-$m" \
      --initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 "${recipe[@]}" --max-seconds "$deadline" \
      --report "$dir/$m$i.json" --start-barrier "$bar" "${extra[@]}" "$@" ${TTA_COLLAB_FLAGS:-} \
      > "$dir/$m$i.out" 2> "$dir/$m$i.log" &
    ps+=($!)
    pids+=($!)
  done
  if ((${TTA_PAUSE:-1})); then
    echo "${ps[@]:1}" > "$dir/$m.pause.tmp" && mv "$dir/$m.pause.tmp" "$dir/$m.pause"
  fi
  # The trainers start their clocks together once all are ready (data loaded, DHT joined):
  # processes that load libtorch together on shared cores are ready up to ~1 s apart under
  # load, and trainer 1 would wait for the last (the trainers wait at most 120 s).
  for _ in $(seq 1200); do
    (($(find "$bar" -name 'ready.*' | wc -l) >= k)) && break
    sleep 0.1
  done
  touch "$bar/go"
  # The others stop as soon as trainer 1 reached the target (not after its exit: their CPU
  # seconds are counted until they stop).
  while kill -0 "${ps[0]}" 2>/dev/null && ! grep -q '^reached test accuracy' "$dir/${m}1.log"; do
    sleep 0.02
  done
  for p in "${ps[@]:1}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait "${ps[0]}" || true
  for p in "${ps[@]:1}"; do
    timeout 15 tail --pid="$p" -f /dev/null || kill -9 "$p" 2>/dev/null || true
  done
  echo "$m $(cut -d' ' -f1 /proc/loadavg)" >> "$dir/loads"
  # How long after trainer 1's clock started the last trainer's started (with the barrier:
  # milliseconds; trainer 1 would wait for it).
  local starts=""
  for i in $(seq "$k"); do starts+=" $(field "$dir/$m$i.json" started_unix)"; done
  lag[$m]=$(echo "$starts" | awk '{ m = 0; for (i = 2; i <= NF; ++i) if ($i - $1 > m) m = $i - $1;
    if (NF < 2) print "-"; else printf "%.2f", m }')
}

declare -A res lag
for m in $modes; do
  case $m in
    sync) collab sync ;;
    delayed) collab delayed --delay-step ;;
    delayed-stale) collab delayed-stale --delay-step --delay-correction none ;;
    delayed-predict) collab delayed-predict --delay-step --delay-correction predict ;;
    delayed-local) collab delayed-local --delay-step --delay-correction local ;;
    delayed-bounded) collab delayed-bounded --delay-step --max-backlog 1 ;;
    f16) collab f16 --compression float16 ;;
    diloco) collab diloco --diloco-steps "$h" ;;
    *) echo "unknown mode $m"; exit 2 ;;
  esac
  res[$m]=$(outcome "$m" "$dir/${m}1.json" "$dir/${m}1.log")
  # CPU seconds of all trainers (trainer 1's at the target, the others' until they stopped,
  # evaluations left out): robust to other load on the machine.
  read -r a b c cpu1 <<<"${res[$m]}"
  if [[ $a != - && -n ${cpu1:-} ]]; then
    cpu=$cpu1
    for i in $(seq 2 "$k"); do cpu=$(awk -v x="$cpu" -v y="$(field "$dir/$m$i.json" cpu_seconds)" 'BEGIN{printf "%.2f", x + y}'); done
    res[$m]="$a $b $c $cpu"
  fi
done

share=$((k < cores ? k : cores))
train_of() { [[ $1 == - ]] && echo - || awk -v s="$1" -v e="$2" 'BEGIN{printf "%.2f", s - e}'; }
alone_t=$(train_of "$alone_s" "${alone_ev:-0}")
ideal=$(awk -v a="$alone_t" -v s="$share" 'BEGIN{ if (a == "-") print "-"; else printf "%.2f", a / s }')
echo "time to test accuracy $target: $k peers vs one process alone, $cores cores, deadline ${deadline} s, load before: $load0"
printf '  %-28s %9s %8s %8s %11s %9s %9s %7s %9s\n' config "wall s" epoch "eval s" "training s" "vs alone" "vs ideal" "CPU s" "CPU ratio"
alone_cpu=${alone_cpu:-}
row() {
  local name=$1 s=$2 ep=$3 evs=$4 cpu=${5:-}
  if [[ $s == - ]]; then
    printf '  %-28s %9s %8s %8s %11s %9s %9s   (best %s at epoch %s)\n' "$name" "not reached" - - - - - "$ep" "$evs"
  else
    local t
    t=$(train_of "$s" "$evs")
    printf '  %-28s %9.1f %8s %8.1f %11.2f %9s %9s %7s %9s\n' "$name" "$s" "$ep" "$evs" "$t" \
      "$(awk -v x="$t" -v a="$alone_t" 'BEGIN{ if (a == "-") print "-"; else printf "%.2f", x / a }')" \
      "$(awk -v x="$t" -v i="$ideal" 'BEGIN{ if (i == "-") print "-"; else printf "%.2f", x / i }')" \
      "$(awk -v x="$cpu" 'BEGIN{ if (x == "") print "-"; else printf "%.2f", x }')" "$(awk -v x="$cpu" -v a="$alone_cpu" 'BEGIN{ if (a == "" || x == "") print "-"; else printf "%.2f", x / a }')"
  fi
}
alone_cpu=$(awk -v x="$(field "$dir/alone.json" target_reached_cpu_seconds)" 'BEGIN{ if (x != "") printf "%.2f", x }')
row "alone (1 process, 1 thread)" $alone_s $alone_ep $alone_ev "$alone_cpu"
[[ -n $alt ]] && row "alone, target batch $alt" $alt_s $alt_ep $alt_ev "${alt_cpu:-}"
echo "  ideal: alone's training s / $share = $ideal s"
for m in $modes; do
  # shellcheck disable=SC2086
  row "$k peers, $m" ${res[$m]}
done
line="  the last trainer's clock started after trainer 1's by (s):"
for m in $modes; do line+=" $m ${lag[$m]}"; done
echo "$line"
echo "  load average (1 min) after each: $(tr '\n' ' ' < "$dir/loads")"
# Accuracy at equal epochs: trainer 1 of every mode evaluated every EVAL epochs until it
# stopped; compare them at the last epoch all of them evaluated (DiLoCo's epochs are outer
# steps: left out).
# acc_at LOG E: "accuracy@epoch" of the last evaluation at or before epoch E.
acc_at() {
  sed -n 's/^epoch \([0-9]*\): test accuracy \([0-9.]*\).*/\1 \2/p' "$1" |
    awk -v e="$2" '$1 <= e { a = $2 "@" $1 } END { print a }'
}
common=""
for m in $modes; do
  [[ $m == diloco ]] && continue
  last=$(sed -n 's/^epoch \([0-9]*\): test accuracy.*/\1/p' "$dir/${m}1.log" | tail -1)
  [[ -n $last ]] && { [[ -z $common ]] || ((last < common)); } && common=$last
done
if [[ -n $common ]]; then
  line="  test accuracy at the last evaluation at or before epoch $common:"
  for m in $modes; do
    [[ $m == diloco ]] && continue
    line+=" $m $(acc_at "$dir/${m}1.log" "$common")"
  done
  echo "$line"
fi
json="{\"bench\":\"time_to_accuracy\",\"target\":$target,\"peers\":$k,\"cores\":$cores,\"deadline\":$deadline"
num() { [[ $1 == - ]] && echo null || echo "$1"; }
[[ -n $alt ]] && json+=",\"alone_alt_target\":$alt,\"alone_alt_training_seconds\":$(num "$(train_of "$alt_s" "${alt_ev:-0}")")"
[[ -n $alone_cpu ]] && json+=",\"alone_cpu_seconds\":$alone_cpu"
json+=",\"alone_seconds\":$(num "$alone_s"),\"alone_training_seconds\":$(num "$alone_t"),\"ideal_seconds\":$(num "$ideal")"
for m in $modes; do
  read -r s ep evs cpu <<<"${res[$m]}"
  t=$(train_of "$s" "$evs")
  json+=",\"${m}_seconds\":$(num "$s"),\"${m}_training_seconds\":$(num "$t")"
  [[ -n ${cpu:-} && $s != - ]] && json+=",\"${m}_cpu_seconds\":$cpu"
  [[ $t == - || $alone_t == - ]] || json+=",\"${m}_vs_alone\":$(awk -v x="$t" -v a="$alone_t" 'BEGIN{printf "%.3f", x / a}')"
done
echo "RESULT $json,\"load_before\":\"$load0\"}"
