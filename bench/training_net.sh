#!/usr/bin/env bash
# Networked collaboration efficiency with real processes (part of make bench-training): for
# SECONDS seconds each, 4 `starling train` processes (1) collaborating through a `starling dht`
# bootstrap node (gradients uncompressed), (2) the same with float16 gradients, (3) and (4)
# both with delayed parameter updates (--delay-step: the round and the step run in the
# background while the next gradients are computed); every window runs 4 more processes
# training alone beside them (the anchor of that window: the load, from other users too, is
# shared by both groups and cancels out in the ratio). The load is printed for every window.
# Prints samples/s of each configuration, the ratio to the anchor, bytes sent per peer per
# epoch against plain synchronous data-parallel (a ring all-reduce of the float32 gradient:
# 2 (k-1)/k x 4 bytes x parameters per step), and one line `RESULT {json}`.
# Usage: bench/training_net.sh BIN [SECONDS]
set -euo pipefail
bin=$1
secs=${2:-60}
k=4
params=203530  # the MLP
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$1" | tr -d '"'; }

"$bin" dht --identity "$dir/boot.key" --listen /ip4/127.0.0.1/tcp/0 --addr-file "$dir/boot.addrs" \
  > "$dir/boot.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s $dir/boot.addrs ]] && break; sleep 0.1; done
boot=$(head -1 "$dir/boot.addrs")

# run NAME EXTRA_ARGS...: k trainers for secs seconds; prints "samples_per_s bytes_per_epoch"
# and appends the load average after the window to $dir/loads. With ANCHOR=1 it also runs k
# trainers alone in the same window (the anchor for this configuration, under the same load)
# and appends their samples/s to $dir/anchors.
run() {
  local name=$1; shift
  local ps=()
  if [[ ${ANCHOR:-0} == 1 ]]; then
    ( read -r a _ < <(ANCHOR=0 run "$name-alone"); echo "$name $a" >> "$dir/anchors" ) &
    ps+=($!)
  fi
  for i in $(seq $k); do
    "$bin" train --identity "$dir/$name$i.key" --run-id "bench-$name" --listen /ip4/127.0.0.1/tcp/0 \
      --target-batch-size 1024 --batch-size 64 --threads 1 --lr 0.002 --max-seconds "$secs" \
      --progress-every 1000 --linger 0 --report "$dir/$name$i.json" "$@" > "$dir/$name$i.log" 2>&1 &
    ps+=($!)
    pids+=($!)
  done
  for p in "${ps[@]}"; do wait "$p"; done
  local sps=0 bpe=0
  for i in $(seq $k); do
    local f=$dir/$name$i.json
    sps=$(awk -v a="$sps" -v s="$(field "$f" samples)" -v t="$(field "$f" seconds)" 'BEGIN{print a + s/t}')
    bpe=$(awk -v a="$bpe" -v b="$(field "$f" bytes_sent)" -v e="$(field "$f" epoch)" -v k=$k \
      'BEGIN{print a + (e > 0 ? b/e : 0)/k}')
  done
  echo "$name $(cut -d' ' -f1 /proc/loadavg)" >> "$dir/loads"
  echo "$sps $bpe"
}

load=$(cut -d' ' -f1-3 /proc/loadavg)
# Every collaborating window runs beside 4 trainers alone (its own anchor, same load).
read -r sync_sps sync_bpe < <(ANCHOR=1 run sync --initial-peers "$boot")
read -r f16_sps f16_bpe < <(ANCHOR=1 run f16 --initial-peers "$boot" --compression float16)
read -r dl_sps dl_bpe < <(ANCHOR=1 run delayed --initial-peers "$boot" --delay-step)
read -r dl16_sps dl16_bpe < <(ANCHOR=1 run delayed16 --initial-peers "$boot" --delay-step --compression float16)
anchor() { awk -v n="$1" '$1 == n {print $2}' "$dir/anchors"; }
alone_sps=$(awk '{s += $2} END {print s / NR}' "$dir/anchors")
dp=$(awk -v n=$params -v k=$k 'BEGIN{print 2*(k-1)/k*4*n}')
echo "training, $k processes x ${secs} s each, load before: $load"
printf '  %-28s %10s %14s %8s %16s %8s\n' config samples/s "anchor samp/s" ratio "bytes/peer/epoch" "vs DP"
for c in "collaborating, float32:$sync_sps:$sync_bpe:sync" "collaborating, float16:$f16_sps:$f16_bpe:f16" \
  "delayed updates, float32:$dl_sps:$dl_bpe:delayed" "delayed updates, float16:$dl16_sps:$dl16_bpe:delayed16"; do
  IFS=: read -r n s b key <<<"$c"
  a=$(anchor "$key")
  printf '  %-28s %10.1f %14.1f %8.3f %16.0f %8.3f\n' "$n" "$s" "$a" "$(awk -v x="$s" -v y="$a" 'BEGIN{print x/y}')" \
    "$b" "$(awk -v x="$b" -v d="$dp" 'BEGIN{print x/d}')"
done
echo "  plain synchronous data-parallel (ring all-reduce, float32): $dp bytes/peer/epoch"
echo "  load average (1 min) after each window: $(tr '\n' ' ' < "$dir/loads")"
ratio() { awk -v a="$1" -v b="$(anchor "$2")" 'BEGIN{print a/b}'; }
echo "RESULT {\"bench\":\"training_net\",\"peers\":$k,\"seconds\":$secs,\"alone_sps\":$alone_sps,\"sync_sps\":$sync_sps,\"sync_ratio\":$(ratio "$sync_sps" sync),\"f16_sps\":$f16_sps,\"f16_ratio\":$(ratio "$f16_sps" f16),\"sync_bytes_per_peer_epoch\":$sync_bpe,\"f16_bytes_per_peer_epoch\":$f16_bpe,\"delayed_sps\":$dl_sps,\"delayed_ratio\":$(ratio "$dl_sps" delayed),\"delayed_f16_sps\":$dl16_sps,\"delayed_f16_ratio\":$(ratio "$dl16_sps" delayed16),\"delayed_bytes_per_peer_epoch\":$dl_bpe,\"dp_bytes_per_peer_epoch\":$dp,\"load_before\":\"$load\"}"
