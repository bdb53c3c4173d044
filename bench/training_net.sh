#!/usr/bin/env bash
# Networked collaboration efficiency with real processes (part of make bench-training): for
# SECONDS seconds each, 4 `starling train` processes (1) collaborating through a `starling dht`
# bootstrap node (gradients uncompressed), (2) the same with float16 gradients, (3) and (4)
# both with delayed parameter updates (--delay-step: the round and the step run in the
# background while the next gradients are computed), (5) and (6) float32 synchronous and
# delayed at a 4x larger target batch (4096: at 1024 a quiet machine computes an epoch in
# ~0.3 s, less than one round's fixed latency); every window runs 4 more processes
# training alone beside them (the anchor of that window: the load, from other users too, is
# shared by both groups and cancels out in the ratio). The load is printed for every window.
# Prints samples/s of each configuration, the ratio to the anchor, the share of the
# collaborating trainers' time spent inside Optimizer::step() (waiting for rounds included),
# bytes sent per peer per epoch against plain synchronous data-parallel (a ring all-reduce of
# the float32 gradient: 2 (k-1)/k x 4 bytes x parameters per step), and one line
# `RESULT {json}`.
# Usage: bench/training_net.sh BIN [SECONDS]   (BENCH_KEEP=DIR keeps the logs)
set -euo pipefail
bin=$1
secs=${2:-60}
k=4
params=203530  # the MLP
dir=$(mktemp -d)
pids=()
# BENCH_KEEP=DIR: the trainers' logs and reports are copied to DIR at the end.
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if [[ -n ${BENCH_KEEP:-} ]]; then mkdir -p "$BENCH_KEEP" && cp -r "$dir"/. "$BENCH_KEEP"/; fi
  rm -rf "$dir"
}
trap cleanup EXIT
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$1" | tr -d '"'; }

"$bin" dht --identity "$dir/boot.key" --listen /ip4/127.0.0.1/tcp/0 --addr-file "$dir/boot.addrs" \
  > "$dir/boot.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s $dir/boot.addrs ]] && break; sleep 0.1; done
boot=$(head -1 "$dir/boot.addrs")

# run NAME EXTRA_ARGS...: k trainers for secs seconds (target batch $TARGET, default 1024);
# prints "samples_per_s bytes_per_epoch step_share" and appends the load average after the window to $dir/loads. With ANCHOR=1 it also runs k
# trainers alone in the same window (the anchor for this configuration, under the same load)
# and appends their samples/s to $dir/anchors.
run() {
  local name=$1; shift
  local ps=()
  if [[ ${ANCHOR:-0} == 1 ]]; then
    ( read -r a _ < <(ANCHOR=0 run "$name-alone"); echo "$name $a" >> "$dir/anchors" ) &
    ps+=($!)
  fi
  # Collaborating trainers log at info (one line per round: matchmaking and all-reduce time).
  local level=info
  [[ ${ANCHOR:-0} == 1 ]] || level=warn
  for i in $(seq $k); do
    STARLING_LOG=$level "$bin" train --identity "$dir/$name$i.key" --run-id "bench-$name" --listen /ip4/127.0.0.1/tcp/0 \
      --target-batch-size "${TARGET:-1024}" --batch-size 64 --threads 1 --lr 0.002 --max-seconds "$secs" \
      --progress-every 1000 --linger 0 --report "$dir/$name$i.json" "$@" > "$dir/$name$i.log" 2>&1 &
    ps+=($!)
    pids+=($!)
  done
  for p in "${ps[@]}"; do wait "$p"; done
  local sps=0 bpe=0 share=0
  for i in $(seq $k); do
    local f=$dir/$name$i.json
    sps=$(awk -v a="$sps" -v s="$(field "$f" samples)" -v t="$(field "$f" seconds)" 'BEGIN{print a + s/t}')
    bpe=$(awk -v a="$bpe" -v b="$(field "$f" bytes_sent)" -v e="$(field "$f" epoch)" -v k=$k \
      'BEGIN{print a + (e > 0 ? b/e : 0)/k}')
    share=$(awk -v a="$share" -v s="$(field "$f" step_seconds)" -v t="$(field "$f" seconds)" -v k=$k \
      'BEGIN{print a + (s + 0)/t/k}')
  done
  echo "$name $(cut -d' ' -f1 /proc/loadavg)" >> "$dir/loads"
  echo "$sps $bpe $share"
}

load=$(cut -d' ' -f1-3 /proc/loadavg)
# Every collaborating window runs beside 4 trainers alone (its own anchor, same load).
read -r sync_sps sync_bpe sync_sh < <(ANCHOR=1 run sync --initial-peers "$boot")
read -r f16_sps f16_bpe f16_sh < <(ANCHOR=1 run f16 --initial-peers "$boot" --compression float16)
read -r dl_sps dl_bpe dl_sh < <(ANCHOR=1 run delayed --initial-peers "$boot" --delay-step)
read -r dl16_sps dl16_bpe dl16_sh < <(ANCHOR=1 run delayed16 --initial-peers "$boot" --delay-step --compression float16)
read -r big_sps big_bpe big_sh < <(TARGET=4096 ANCHOR=1 run sync4096 --initial-peers "$boot")
read -r dlbig_sps dlbig_bpe dlbig_sh < <(TARGET=4096 ANCHOR=1 run delayed4096 --initial-peers "$boot" --delay-step)
anchor() { awk -v n="$1" '$1 == n {print $2}' "$dir/anchors"; }
alone_sps=$(awk '{s += $2} END {print s / NR}' "$dir/anchors")
dp=$(awk -v n=$params -v k=$k 'BEGIN{print 2*(k-1)/k*4*n}')
echo "training, $k processes x ${secs} s each, load before: $load"
printf '  %-34s %10s %14s %8s %8s %16s %8s\n' config samples/s "anchor samp/s" ratio "in step" "bytes/peer/epoch" "vs DP"
for c in "collaborating, float32:$sync_sps:$sync_bpe:sync:$sync_sh" \
  "collaborating, float16:$f16_sps:$f16_bpe:f16:$f16_sh" \
  "delayed updates, float32:$dl_sps:$dl_bpe:delayed:$dl_sh" \
  "delayed updates, float16:$dl16_sps:$dl16_bpe:delayed16:$dl16_sh" \
  "collaborating, float32, target 4096:$big_sps:$big_bpe:sync4096:$big_sh" \
  "delayed, float32, target 4096:$dlbig_sps:$dlbig_bpe:delayed4096:$dlbig_sh"; do
  IFS=: read -r n s b key sh <<<"$c"
  a=$(anchor "$key")
  printf '  %-34s %10.1f %14.1f %8.3f %8.3f %16.0f %8.3f\n' "$n" "$s" "$a" \
    "$(awk -v x="$s" -v y="$a" 'BEGIN{print x/y}')" "$sh" "$b" "$(awk -v x="$b" -v d="$dp" 'BEGIN{print x/d}')"
done
# Median matchmaking and all-reduce seconds of a configuration's rounds (from the info logs).
median() { sort -n | awk '{v[NR] = $1} END {if (NR) printf "%.2f", v[int((NR + 1) / 2)]; else printf "-"}'; }
rounds() {
  local t
  t=$(cat "$dir/$1"[0-9].log | sed -n 's/.*round [a-z]*\/[0-9]*: [0-9]* peers.*matchmaking \([0-9.]*\) s, all-reduce \([0-9.]*\) s.*/\1 \2/p')
  echo "$(grep -c . <<<"$t") round lines, median matchmaking $(cut -d' ' -f1 <<<"$t" | median) s," \
    "all-reduce $(cut -d' ' -f2 <<<"$t" | median) s"
}
echo "  round latency (collaborating trainers' logs):"
for key in sync f16 delayed delayed16 sync4096 delayed4096; do echo "    $key: $(rounds $key)"; done
echo "  plain synchronous data-parallel (ring all-reduce, float32): $dp bytes/peer/epoch"
echo "  load average (1 min) after each window: $(tr '\n' ' ' < "$dir/loads")"
ratio() { awk -v a="$1" -v b="$(anchor "$2")" 'BEGIN{print a/b}'; }
echo "RESULT {\"bench\":\"training_net\",\"peers\":$k,\"seconds\":$secs,\"alone_sps\":$alone_sps,\"sync_sps\":$sync_sps,\"sync_ratio\":$(ratio "$sync_sps" sync),\"f16_sps\":$f16_sps,\"f16_ratio\":$(ratio "$f16_sps" f16),\"sync_bytes_per_peer_epoch\":$sync_bpe,\"f16_bytes_per_peer_epoch\":$f16_bpe,\"delayed_sps\":$dl_sps,\"delayed_ratio\":$(ratio "$dl_sps" delayed),\"delayed_f16_sps\":$dl16_sps,\"delayed_f16_ratio\":$(ratio "$dl16_sps" delayed16),\"delayed_bytes_per_peer_epoch\":$dl_bpe,\"sync4096_sps\":$big_sps,\"sync4096_ratio\":$(ratio "$big_sps" sync4096),\"delayed4096_sps\":$dlbig_sps,\"delayed4096_ratio\":$(ratio "$dlbig_sps" delayed4096),\"step_share\":{\"sync\":$sync_sh,\"f16\":$f16_sh,\"delayed\":$dl_sh,\"delayed16\":$dl16_sh,\"sync4096\":$big_sh,\"delayed4096\":$dlbig_sh},\"dp_bytes_per_peer_epoch\":$dp,\"load_before\":\"$load\"}"
