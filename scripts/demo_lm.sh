#!/usr/bin/env bash
# make demo-lm: a `starling dht` bootstrap node and 4 `starling train --task lm` processes on
# loopback train the transformer language model together (WordNet glosses from Debian's
# wordnet-base, byte-level BPE, LAMB with warm-up and cosine decay). Once the collaboration
# reaches KILL_AT epochs, trainer 2 is SIGKILLed and trainer 5 joins (it downloads the state and
# catches up); a trainer with another vocabulary tries to join and is refused. At the end:
# held-out perplexity before and after, samples and bytes per peer, and the parameter hashes.
# Exits non-zero if a check fails: perplexity at most a quarter of the initial one, identical hashes on
# every live peer, the refused joiner refused, the stage under LIMIT seconds.
# Usage: scripts/demo_lm.sh [BUILD]   (tunables: EPOCHS, TARGET, LR, KILL_AT, LIMIT)
set -euo pipefail
build=${1:-build}
bin=$build/bin/starling
epochs=${EPOCHS:-100}
target=${TARGET:-192}
lr=${LR:-0.02}
kill_at=${KILL_AT:-$((epochs / 3))}
limit=${LIMIT:-600}
[[ -f /usr/share/wordnet/data.noun ]] || {
  echo "wordnet-base is not installed (scripts/install-deps.sh): skipping"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap_node.sh"
demo_workdir
t0=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)

echo "== language model together: a DHT bootstrap node and 4 trainers (target batch $target sequences, $epochs epochs, LAMB lr $lr)"
start_bootstrap "$bin" "$dir"
echo "   bootstrap node: $boot"

common=(--task lm --optimizer lamb --lr "$lr" --max-grad-norm 1 --warmup-epochs 5
        --decay-epochs "$epochs" --batch-size 8 --target-batch-size "$target" --threads 1
        --eval-windows 64 --cache-dir "$dir/cache" --metrics-interval 2)
declare -A tpid
start_trainer() {
  local i=$1
  STARLING_LOG=${STARLING_LOG:-warn} "$bin" train --identity "$dir/t$i.key" --initial-peers "$boot" \
    --listen /ip4/127.0.0.1/tcp/0 "${common[@]}" --max-epochs "$epochs" --eval-every 20 \
    --progress-every 20 --report "$dir/t$i.json" > "$dir/t$i.log" 2>&1 &
  tpid[$i]=$!
  pids+=("${tpid[$i]}")
  echo "   trainer $i started (pid ${tpid[$i]})"
}
epoch_of() { { grep -ao 'epoch [0-9]*' "$dir/t$1.log" 2>/dev/null || true; } | tail -1 | awk '{print $2+0}'; }
for i in 1 2 3 4; do start_trainer "$i"; done
sed -n 's/^peer [^ ]* run [^ ]* /   /p' "$dir/t1.log" | head -1 || true

while :; do
  e=$(epoch_of 1); e=${e:-0}
  (( e >= kill_at )) && break
  kill -0 "${tpid[1]}" 2>/dev/null || { echo "trainer 1 exited early"; cat "$dir/t1.log"; exit 1; }
  (( $(date +%s) - t0 > limit )) && { echo "no progress before the time limit"; exit 1; }
  sleep 2
done
grep -m1 '^peer' "$dir/t1.log" | sed 's/^peer [^ ]* run [^ ]* /   task: /'
echo "== epoch $e: SIGKILL trainer 2; trainer 5 joins"
kill -9 "${tpid[2]}"
start_trainer 5

echo "== a trainer with another vocabulary (--vocab-size 1024) tries to join"
refused=0
if "$bin" train --identity "$dir/bad.key" --initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 \
    "${common[@]}" --vocab-size 1024 --max-seconds 5 --no-metrics > "$dir/bad.log" 2>&1; then
  echo "   it was NOT refused"
else
  grep -q "vocabulary" "$dir/bad.log" && refused=1
  sed -n 's/^error: /   refused: /p' "$dir/bad.log" | cut -c1-200
fi

live=(1 3 4 5)
wait_trainers "$limit" "$t0" "${live[@]}"
kill -INT "$boot_pid" 2>/dev/null || true
secs=$(($(date +%s) - t0))
load1=$(cut -d' ' -f1-3 /proc/loadavg)

echo "== results"
before=$(sed -n 's/^epoch 0 (start): held-out perplexity \([0-9.]*\).*/\1/p' "$dir/t1.log" | head -1)
printf '   %-6s %-12s %6s %11s %8s %8s %s\n' peer stop epoch perplexity samples "MB sent" param_hash
ok=1
hashes=()
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$dir/t$1.json" | tr -d '"'; }
printf '   %-6s %-12s\n' "t2" "SIGKILLed"
for i in "${live[@]}"; do
  [[ -s $dir/t$i.json ]] || { echo "   t$i: no report"; ok=0; continue; }
  ppl=$(field "$i" heldout_perplexity)
  printf '   %-6s %-12s %6s %11.2f %8s %8.1f %s\n' "t$i" "$(field "$i" stop)" "$(field "$i" epoch)" \
    "$ppl" "$(field "$i" samples)" "$(awk -v b="$(field "$i" bytes_sent)" 'BEGIN{print b/1e6}')" \
    "$(field "$i" param_hash)"
  awk -v a="$ppl" -v b="$before" 'BEGIN { exit !(a > 0 && a <= 0.25 * b) }' ||
    { echo "   t$i: perplexity $ppl is not at most a quarter of $before"; ok=0; }
  hashes+=("$(field "$i" param_hash)")
done
after=$(field 1 heldout_perplexity)
echo "   held-out perplexity (64 windows of 128 tokens): before ${before} -> after ${after}"
echo "   joiner t5 state downloads: $(field 5 state_downloads)"
if [[ $(printf '%s\n' "${hashes[@]}" | sort -u | wc -l) == 1 && ${#hashes[@]} == 4 ]]; then
  echo "   all live peers hold identical parameters: ${hashes[0]}"
else
  echo "   parameter hashes differ"; ok=0
fi
(( refused == 1 )) || { echo "   the trainer with another vocabulary was not refused"; ok=0; }
echo "   demo-lm: ${secs} s (limit ${limit} s); load average before ${load0}, after ${load1}"
(( secs < limit )) || ok=0
(( ok == 1 )) || { echo "== demo-lm: a check failed"; exit 1; }
echo "== demo-lm: all checks passed"
