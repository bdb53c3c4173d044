#!/usr/bin/env bash
# make bench-lm: the language-model task (`starling train --task lm`: the tiny causal
# transformer, LAMB, target batch 192 windows of 128 tokens, batch 8, one thread per trainer).
#  1. Efficiency: bench/training_net.sh's method on the LM (4 trainers collaborating for
#     NET_SECONDS beside 4 alone in the same window), synchronous float32, float16, delayed.
#  2. Quality at equal samples: 4 collaborating trainers for EPOCHS epochs, synchronous and
#     DiLoCo (H = 20 local steps per outer round), against one process alone with the same
#     number of samples; held-out perplexity (64 windows) of each, the ratio to alone (target:
#     within 2%), and bytes sent per peer per epoch against plain data-parallel (a ring
#     all-reduce of the float32 gradient per step of TARGET windows).
# Prints tables and one line `RESULT {json}` per part.
# Usage: bench/run-lm.sh [BUILD]   (env: NET_SECONDS (40), EPOCHS (60), TARGET (192), H (20))
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build=${1:-$root/build}
[[ -f "$build/build.ninja" ]] || cmake --preset release -S "$root" -B "$build" >/dev/null
cmake --build "$build" --target starling_cli -j"${JOBS:-2}" >/dev/null
bin=$build/bin/starling
[[ -f /usr/share/wordnet/data.noun ]] || {
  echo "wordnet-base is not installed (scripts/install-deps.sh)"; exit 1; }
epochs=${EPOCHS:-60}
target=${TARGET:-192}
h=${H:-20}
k=4
params=675328  # the tiny LM
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$1" | tr -d '"'; }
recipe=(--task lm --optimizer lamb --lr 0.02 --max-grad-norm 1 --batch-size 8 --threads 1
        --eval-windows 64 --cache-dir "$dir/cache" --no-metrics)
# The learning-rate schedule runs on the collaboration's epochs: 5 warm-up epochs, cosine decay
# to EPOCHS. DiLoCo's epochs are outer rounds of H x 8 x 4 windows: the same schedule in samples.
sched=(--warmup-epochs 5 --decay-epochs "$epochs")
samples=$((epochs * target))
per_outer=$((h * 8 * k))
outer=$(( (samples + per_outer - 1) / per_outer ))
sched_diloco=(--warmup-epochs $(( (5 * target + per_outer - 1) / per_outer )) --decay-epochs "$outer")

# The tokenizer is trained once into the shared cache before anything is timed.
"$bin" train --identity "$dir/warm.key" --run-id lm-warm "${recipe[@]}" --max-samples 8 \
  > "$dir/warm.log" 2>&1 || { echo "LM task did not start:"; tail -5 "$dir/warm.log"; exit 1; }

# Part 1: samples/s against the same trainers alone.
TN_NAME=lm TN_PARAMS=$params TN_TARGET=$target TN_CONFIGS="sync f16 delayed" \
  TN_RECIPE="${recipe[*]} ${sched[*]}" "$root/bench/training_net.sh" "$bin" "${NET_SECONDS:-40}"

# Part 2: held-out perplexity at equal samples.
load0=$(cut -d' ' -f1-3 /proc/loadavg)
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap_node.sh"
start_bootstrap "$bin" "$dir"
# collab NAME FLAGS...: 4 trainers until the collaboration has SAMPLES samples.
collab() {
  local name=$1; shift
  local ps=()
  for i in $(seq $k); do
    "$bin" train --identity "$dir/$name$i.key" --run-id "lm-$name" --initial-peers "$boot" \
      --listen /ip4/127.0.0.1/tcp/0 "${recipe[@]}" --linger 10 --target-batch-size "$target" "$@" \
      --report "$dir/$name$i.json" > "$dir/$name$i.log" 2>&1 &
    ps+=($!)
    pids+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || { echo "$name trainer failed"; tail -5 "$dir/$name"*.log; exit 1; }; done
}
t0=$(date +%s.%N)
"$bin" train --identity "$dir/alone.key" --run-id lm-alone "${recipe[@]}" "${sched[@]}" --target-batch-size "$target" \
  --max-epochs "$epochs" --report "$dir/alone.json" > "$dir/alone.log" 2>&1
t1=$(date +%s.%N)
collab sync "${sched[@]}" --max-epochs "$epochs"
t2=$(date +%s.%N)
collab diloco "${sched_diloco[@]}" --diloco-steps "$h" --max-epochs "$outer"
t3=$(date +%s.%N)
load1=$(cut -d' ' -f1-3 /proc/loadavg)

dp=$(awk -v n=$params -v k=$k 'BEGIN{print 2*(k-1)/k*4*n}')
alone_ppl=$(field "$dir/alone.json" heldout_perplexity)
echo "language model at equal samples ($samples windows; DiLoCo: $outer outer epochs of H = $h), load before: $load0, after: $load1"
printf '  %-26s %7s %8s %11s %9s %8s %16s %8s %s\n' config epochs samples perplexity "vs alone" "wall s" "bytes/peer/epoch" "vs DP" "param hashes"
row() {
  local name=$1 label=$2 secs=$3 per_epoch_mult=$4
  local ppl ep bpe hashes total=0
  for i in $(seq $k); do total=$((total + $(field "$dir/$name$i.json" samples))); done
  ppl=$(field "$dir/${name}1.json" heldout_perplexity)
  ep=$(field "$dir/${name}1.json" epoch)
  bpe=0
  for i in $(seq $k); do
    bpe=$(awk -v a="$bpe" -v b="$(field "$dir/$name$i.json" bytes_sent)" -v e="$ep" -v k=$k \
      -v m="$per_epoch_mult" 'BEGIN{print a + (e > 0 ? b / (e * m) : 0) / k}')
  done
  hashes=$(for i in $(seq $k); do field "$dir/$name$i.json" param_hash; done | sort -u | wc -l)
  printf '  %-26s %7s %8s %11.2f %9.3f %8.1f %16.0f %8.3f %s\n' "$label" "$ep" "$total" "$ppl" \
    "$(awk -v a="$ppl" -v b="$alone_ppl" 'BEGIN{print a / b}')" "$secs" "$bpe" \
    "$(awk -v x="$bpe" -v d="$dp" 'BEGIN{print x / d}')" \
    "$([[ $hashes == 1 ]] && echo identical || echo "$hashes different")"
  echo "$ppl $bpe" > "$dir/$name.row"
}
printf '  %-26s %7s %8s %11.2f %9s %8.1f\n' "1 process alone" "$(field "$dir/alone.json" epoch)" \
  "$(field "$dir/alone.json" samples)" "$alone_ppl" 1.000 \
  "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b - a}')"
row sync "4 peers, synchronous" "$(awk -v a="$t1" -v b="$t2" 'BEGIN{print b - a}')" 1
# DiLoCo's bytes per outer epoch spread over the target-batch epochs it covers.
row diloco "4 peers, DiLoCo H $h" "$(awk -v a="$t2" -v b="$t3" 'BEGIN{print b - a}')" \
  "$(awk -v h="$h" -v k=$k -v t="$target" 'BEGIN{print h * 8 * k / t}')"
echo "  bytes/peer/epoch: per $target windows of training; plain data-parallel: $dp"
read -r sp sb < "$dir/sync.row"
read -r dp_ppl db < "$dir/diloco.row"
echo "RESULT {\"bench\":\"lm_quality\",\"samples\":$samples,\"alone_perplexity\":$alone_ppl,\"sync_perplexity\":$sp,\"diloco_perplexity\":$dp_ppl,\"diloco_h\":$h,\"sync_bytes_per_peer_epoch\":$sb,\"diloco_bytes_per_peer_epoch\":$db,\"dp_bytes_per_peer_epoch\":$dp,\"load_before\":\"$load0\"}"
