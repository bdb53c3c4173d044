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
# Other tasks (bench/run-lm.sh): TN_RECIPE (the trainers' task flags; default the MLP's),
# TN_TARGET (target batch; default 1024), TN_PARAMS (the model's parameter count),
# TN_CONFIGS (a subset of "sync f16 delayed delayed16 sync4096 delayed4096"), TN_NAME.
set -euo pipefail
bin=$1
secs=${2:-60}
k=4
params=${TN_PARAMS:-203530}  # the MLP
read -r -a recipe <<<"${TN_RECIPE:---batch-size 64 --threads 1 --lr 0.002}"
configs=${TN_CONFIGS:-sync f16 delayed delayed16 sync4096 delayed4096}
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

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/bootstrap_node.sh"
start_bootstrap "$bin" "$dir"

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
      --target-batch-size "${TARGET:-${TN_TARGET:-1024}}" "${recipe[@]}" --max-seconds "$secs" \
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
big=$((4 * ${TN_TARGET:-1024}))
# flags_of CONFIG / label_of CONFIG: each configuration's extra flags and its row label.
flags_of() {
  case $1 in
    sync) echo "" ;;
    f16) echo "--compression float16" ;;
    delayed) echo "--delay-step" ;;
    delayed16) echo "--delay-step --compression float16" ;;
    sync4096) echo "" ;;
    delayed4096) echo "--delay-step" ;;
    *) echo "unknown configuration $1" >&2; exit 2 ;;
  esac
}
label_of() {
  case $1 in
    sync) echo "collaborating, float32" ;;
    f16) echo "collaborating, float16" ;;
    delayed) echo "delayed updates, float32" ;;
    delayed16) echo "delayed updates, float16" ;;
    sync4096) echo "collaborating, float32, target $big" ;;
    delayed4096) echo "delayed, float32, target $big" ;;
  esac
}
# Every collaborating window runs beside 4 trainers alone (its own anchor, same load).
declare -A sps bpe sh
for c in $configs; do
  t=${TN_TARGET:-1024}
  [[ $c == *4096 ]] && t=$big
  # shellcheck disable=SC2046
  read -r sps[$c] bpe[$c] sh[$c] < <(TARGET=$t ANCHOR=1 run "$c" --initial-peers "$boot" $(flags_of "$c"))
done
anchor() { awk -v n="$1" '$1 == n {print $2}' "$dir/anchors"; }
alone_sps=$(awk '{s += $2} END {print s / NR}' "$dir/anchors")
dp=$(awk -v n="$params" -v k=$k 'BEGIN{print 2*(k-1)/k*4*n}')
echo "training${TN_NAME:+ ($TN_NAME)}, $k processes x ${secs} s each, load before: $load"
printf '  %-34s %10s %14s %8s %8s %16s %8s\n' config samples/s "anchor samp/s" ratio "in step" "bytes/peer/epoch" "vs DP"
for c in $configs; do
  a=$(anchor "$c")
  printf '  %-34s %10.1f %14.1f %8.3f %8.3f %16.0f %8.3f\n' "$(label_of "$c")" "${sps[$c]}" "$a" \
    "$(awk -v x="${sps[$c]}" -v y="$a" 'BEGIN{print x/y}')" "${sh[$c]}" "${bpe[$c]}" \
    "$(awk -v x="${bpe[$c]}" -v d="$dp" 'BEGIN{print x/d}')"
done
# Median matchmaking and all-reduce seconds of a configuration's rounds (from the info logs).
median() { sort -n | awk '{v[NR] = $1} END {if (NR) printf "%.2f", v[int((NR + 1) / 2)]; else printf "-"}'; }
rounds() {
  local t
  t=$(cat "$dir/$1"[0-9].log | sed -n 's/.*round [a-z]*\/[0-9]*: [0-9]* peers.*matchmaking \([0-9.]*\) s, all-reduce \([0-9.]*\) s.*/\1 \2/p')
  echo "$(grep -c . <<<"$t") round lines, median matchmaking $(cut -d' ' -f1 <<<"$t" | median) s," \
    "all-reduce $(cut -d' ' -f2 <<<"$t" | median) s"
}
# The round's time line, medians in ms over every round line (older binaries: "-"): data =
# group formed -> this trainer's data (its computing, when the group formed early); others =
# its data -> the others' data for the parts it owns (waiting for the slowest member); exchange
# = both -> round done (the all-reduce's own latency); close = done -> streams closed; apply = round line -> the trainer's next epoch line
# (handing the result to the training thread and the optimizer step); period = one epoch
# (consecutive epoch lines of a trainer).
breakdown() {
  local f v
  for f in "$dir/$1"[0-9].log; do
    awk '
      function t(s,  a) { split(s, a, ":"); return (a[1] * 3600 + a[2] * 60 + a[3]) * 1000 }
      / round [a-z]*\/[0-9]*: [0-9]* peers.*; data / {
        r = t($1)
        for (i = 1; i <= NF; i++) {
          if ($i == "data") d = $(i + 1); if ($i == "others") o = $(i + 1)
          if ($i == "exchange") x = $(i + 1); if ($i == "close") c = $(i + 1)
        }
        print "data", d; print "others", o; print "exchange", x; print "close", c
      }
      / epoch [0-9]* -> [0-9]*: averaged/ {
        e = t($1); if (r) print "apply", e - r; if (last) print "period", e - last; last = e; r = 0
      }' "$f"
  done > "$dir/$1.breakdown"
  for v in data others exchange close apply period; do
    printf ' %s %s' "$v" "$(awk -v k=$v '$1 == k {print $2}' "$dir/$1.breakdown" | median)"
  done
}
echo "  round latency (collaborating trainers' logs):"
for c in $configs; do echo "    $c: $(rounds "$c")"; done
echo "  round time line, median ms (data: computing after the group formed; others: waiting for"
echo "  the slowest member's data; exchange: the all-reduce after both; close: closing its streams;"
echo "  apply: round result -> next epoch on the training thread; period: one epoch):"
for c in $configs; do echo "    $c:$(breakdown "$c")"; done
echo "  plain synchronous data-parallel (ring all-reduce, float32): $dp bytes/peer/epoch"
echo "  load average (1 min) after each window: $(tr '\n' ' ' < "$dir/loads")"
ratio() { awk -v a="$1" -v b="$(anchor "$2")" 'BEGIN{print a/b}'; }
json="{\"bench\":\"training_net\",\"task\":\"${TN_NAME:-mlp}\",\"peers\":$k,\"seconds\":$secs,\"alone_sps\":$alone_sps"
shares=""
for c in $configs; do
  n=${c/delayed16/delayed_f16}
  json+=",\"${n}_sps\":${sps[$c]},\"${n}_ratio\":$(ratio "${sps[$c]}" "$c"),\"${n}_bytes_per_peer_epoch\":${bpe[$c]}"
  shares+="${shares:+,}\"$c\":${sh[$c]}"
done
echo "RESULT $json,\"step_share\":{$shares},\"dp_bytes_per_peer_epoch\":$dp,\"load_before\":\"$load\"}"
