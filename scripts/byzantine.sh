#!/usr/bin/env bash
# Training with a hostile peer: a `starling dht` bootstrap node, 4 honest `starling train`
# peers and ATTACKERS peers started with `--attack KIND` (reversed x -10 or random noise
# 100x the gradient's RMS, claiming 10x the samples) train the Fashion-MNIST MLP for EPOCHS epochs, once
# with every peer reducing by the mean and once with --aggregation centered-clip; and once
# without attackers (the reference). Prints the honest peers' test accuracy and parameter
# hashes per run and one line `RESULT {json}`.
# With CHECK=1 (ctest byzantine) it fails unless, under attack, centered-clip keeps every
# honest peer at test accuracy >= MIN_ACC (0.8) with identical parameters.
# Usage: scripts/byzantine.sh [BUILD]   (env: EPOCHS (60), ATTACK (sign-flip), ATTACKERS (1))
set -euo pipefail
build=${1:-build}
bin=$build/bin/starling
epochs=${EPOCHS:-60}
attack=${ATTACK:-sign-flip}
attackers=${ATTACKERS:-1}
min_acc=${MIN_ACC:-0.8}
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap_node.sh"
demo_workdir
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$1" | tr -d '"'; }
start_bootstrap "$bin" "$dir"
common=(--initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 --target-batch-size 1024
        --batch-size 64 --threads 1 --lr 0.003 --max-epochs "$epochs" --linger 20 --no-metrics)

# run NAME ATTACKERS FLAGS...: prints "accuracy_min accuracy_max distinct_hashes epochs".
run() {
  local name=$1 bad=$2; shift 2
  local ps=() honest=()
  for i in 1 2 3 4; do
    "$bin" train --identity "$dir/$name$i.key" --run-id "byz-$name" "${common[@]}" "$@" \
      --report "$dir/$name$i.json" > "$dir/$name$i.log" 2>&1 &
    ps+=($!); honest+=($!); pids+=($!)
  done
  for a in $(seq "$bad"); do
    "$bin" train --identity "$dir/${name}a$a.key" --run-id "byz-$name" "${common[@]}" "$@" \
      --attack "$attack" --report "$dir/${name}a$a.json" > "$dir/${name}a$a.log" 2>&1 &
    ps+=($!); pids+=($!)
  done
  for p in "${honest[@]}"; do wait "$p" || true; done
  for p in "${ps[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${ps[@]}"; do wait "$p" 2>/dev/null || true; done
  local accs=() hashes=() eps=()
  for i in 1 2 3 4; do
    [[ -s $dir/$name$i.json ]] || { echo "0 0 9 0"; return; }
    accs+=("$(field "$dir/$name$i.json" test_accuracy)")
    hashes+=("$(field "$dir/$name$i.json" param_hash)")
    eps+=("$(field "$dir/$name$i.json" epoch)")
  done
  printf '%s\n' "${accs[@]}" | sort -g | sed -n '1p;$p' | tr '\n' ' '
  echo "$(printf '%s\n' "${hashes[@]}" | sort -u | wc -l) $(printf '%s\n' "${eps[@]}" | sort -g | head -1)"
}
load0=$(cut -d' ' -f1-3 /proc/loadavg)
read -r ref_lo ref_hi ref_h ref_e < <(run ref 0)
read -r mean_lo mean_hi mean_h mean_e < <(run mean "$attackers")
read -r clip_lo clip_hi clip_h clip_e < <(run clip "$attackers" --aggregation centered-clip)
read -r cref_lo cref_hi cref_h cref_e < <(run clipref 0 --aggregation centered-clip)
echo "training with $attackers hostile peer(s) (--attack $attack) among 4 honest ones, $epochs epochs, load before: $load0"
printf '  %-40s %10s %10s %8s %12s\n' run "acc min" "acc max" epoch "param hashes"
row() { printf '  %-40s %10s %10s %8s %12s\n' "$1" "$2" "$3" "$5" "$4"; }
row "no attacker, mean" "$ref_lo" "$ref_hi" "$ref_h" "$ref_e"
row "no attacker, centered-clip" "$cref_lo" "$cref_hi" "$cref_h" "$cref_e"
row "$attackers attacker(s), mean" "$mean_lo" "$mean_hi" "$mean_h" "$mean_e"
row "$attackers attacker(s), centered-clip" "$clip_lo" "$clip_hi" "$clip_h" "$clip_e"
echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "RESULT {\"bench\":\"byzantine\",\"attack\":\"$attack\",\"attackers\":$attackers,\"epochs\":$epochs,\"ref_acc\":$ref_lo,\"clip_ref_acc\":$cref_lo,\"mean_attacked_acc\":$mean_lo,\"clip_attacked_acc\":$clip_lo,\"load_before\":\"$load0\"}"
if [[ ${CHECK:-0} == 1 ]]; then
  ok=1
  awk -v a="$clip_lo" -v m="$min_acc" 'BEGIN{exit !(a >= m)}' ||
    { echo "centered-clip under attack: an honest peer at $clip_lo < $min_acc"; ok=0; }
  [[ $clip_h == 1 ]] || { echo "centered-clip under attack: honest peers' parameters differ"; ok=0; }
  ((ok == 1)) || exit 1
  echo "byzantine: checks passed"
fi
