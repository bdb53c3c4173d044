#!/usr/bin/env bash
# Training with hostile peers (docs/security.md, issue 20's benchmark): PEERS `starling train`
# peers of which ATTACKERS attack (`--attack KIND`, one kind per run) train the Fashion-MNIST
# MLP for EPOCHS epochs through a `starling dht` bootstrap node; the same PEERS-ATTACKERS honest
# peers also train alone (the clean runs, the anchor, in this script). Per attack: with plain
# mean (gradient attacks only: the protocol attacks live in the accountable round) and with
# centered-clip + --verify. Prints per run the honest peers' test accuracy (min, max), its
# ratio to the clean run with the same aggregation, the number of distinct honest parameter
# hashes, whether every honest peer banned every attacker, honest peers banned by honest
# peers, the most rounds an attacker completed (a banned one completes none after its ban;
# attackers start after the honest peers and join later rounds), and the median all-reduce
# time of honest peer 1 (completed rounds); one
# `RESULT {json}` line per run. The clean runs (mean, centered-clip, centered-clip + --verify)
# also give the round-time overhead of centered-clip and of --verify without attackers.
# With GRAD_CHECK=K the centered-clip + --verify runs add `--grad-check K` (docs/security.md
# "Gradient check"); each such row then also prints honest peer 1's gradient checks, their
# time per completed round and its own training compute per epoch (seconds outside step(),
# evaluations included, over its epochs): the check's cost against the anchor of the same run.
# Usage: bench/run-byzantine.sh [BUILD]
#   env: EPOCHS (40), PEERS (7), ATTACKERS (2), ATTACKS (all, space-separated), WORKER_MOMENTUM
#   (0.9: --worker-momentum of the centered-clip runs; 0 when GRAD_CHECK is set: the check
#   re-computes the step's gradient, not a moving average), LOGDIR (if set, the peers' logs
#   are copied there), GRAD_CHECK (0), CLIP_FLAGS (extra flags of the centered-clip + verify
#   runs, e.g. "--clip-cut 0": CenteredClip without its cut)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build=${1:-$root/build}
bin=$build/bin/starling
[[ -x $bin && -x $build/bin/starling-train ]] || { echo "build starling_cli and starling_train first" >&2; exit 1; }
epochs=${EPOCHS:-40}
peers=${PEERS:-7}
attackers=${ATTACKERS:-2}
attacks=${ATTACKS:-sign-flip random alie label-flip stall flood wrong-average different-parts false-report directory-lie}
honest_n=$((peers - attackers))
source "$root/scripts/bootstrap_node.sh"
demo_workdir
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$1" | tr -d '"'; }
start_bootstrap "$bin" "$dir"
common=(--initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 --target-batch-size 1024
        --batch-size 64 --threads 1 --lr 0.003 --max-epochs "$epochs" --linger 20 --no-metrics)
# Worker momentum with CenteredClip (docs/security.md; WORKER_MOMENTUM=0: gradients averaged).
grad_check=${GRAD_CHECK:-0}
if ((grad_check == 0)); then wm=${WORKER_MOMENTUM:-0.9}; else wm=${WORKER_MOMENTUM:-0}; fi
clip=(--aggregation centered-clip --verify --worker-momentum "$wm")
# shellcheck disable=SC2206 # CLIP_FLAGS: extra flags of every centered-clip run, word-split
[[ -z ${CLIP_FLAGS:-} ]] || clip+=($CLIP_FLAGS)
((grad_check == 0)) || clip+=(--grad-check "$grad_check")
export STARLING_LOG=info

# run NAME BAD ATTACK FLAGS...: prints "acc_min acc_max hashes banned_all honest_bans
# rounds_to_ban allreduce_median".
run() {
  local name=$1 bad=$2 attack=$3; shift 3
  local ps=() honest=() hid=() bid=() i
  for i in $(seq "$honest_n"); do
    hid+=("$("$bin" id --identity "$dir/$name-h$i.key" 2>/dev/null | tail -1)")
    "$build/bin/starling-train" train --identity "$dir/$name-h$i.key" --run-id "byz-$name" \
      "${common[@]}" "$@" --report "$dir/$name-h$i.json" > "$dir/$name-h$i.log" 2>&1 &
    ps+=($!); honest+=($!); pids+=($!)
  done
  for i in $(seq "$bad"); do
    bid+=("$("$bin" id --identity "$dir/$name-a$i.key" 2>/dev/null | tail -1)")
    "$build/bin/starling-train" train --identity "$dir/$name-a$i.key" --run-id "byz-$name" \
      "${common[@]}" "$@" --attack "$attack" --report "$dir/$name-a$i.json" \
      > "$dir/$name-a$i.log" 2>&1 &
    ps+=($!); pids+=($!)
  done
  for p in "${honest[@]}"; do wait "$p" || true; done
  for p in "${ps[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${ps[@]}"; do wait "$p" 2>/dev/null || true; done
  local accs=() hashes=() banned_all=1 honest_bans=0 rounds=0 log b h n
  for i in $(seq "$honest_n"); do
    log=$dir/$name-h$i.log
    [[ -s $dir/$name-h$i.json ]] || { echo "0 0 9 0 0 0 0"; return; }
    accs+=("$(field "$dir/$name-h$i.json" test_accuracy)")
    hashes+=("$(field "$dir/$name-h$i.json" param_hash)")
    for b in "${bid[@]}"; do grep -q "banned peer $b" "$log" || banned_all=0; done
    for h in "${hid[@]}"; do grep -q "banned peer $h" "$log" && honest_bans=$((honest_bans + 1)); done
  done
  ((bad > 0)) || banned_all=-
  for i in $(seq "$bad"); do  # rounds an attacker completed (none once it is banned)
    n=$(grep -c "round grads/[0-9]*: [0-9]* peers" "$dir/$name-a$i.log" || true)
    ((n > rounds)) && rounds=$n
  done
  local med
  med=$(sed -n 's/.*round grads\/[0-9]*: .*all-reduce \([0-9.]*\) s.*/\1/p' "$dir/$name-h1.log" | sort -g |
    awk '{a[NR]=$1} END{print NR ? a[int((NR+1)/2)] : 0}')
  if ((grad_check > 0)) && [[ " $* " == *" --grad-check "* ]]; then
    local j=$dir/$name-h1.json
    awk -v c="$(field "$j" grad_checks)" -v f="$(field "$j" grad_check_failures)" \
      -v gs="$(field "$j" grad_check_seconds)" -v r="$(field "$j" rounds_ok)" \
      -v s="$(field "$j" seconds)" -v st="$(field "$j" step_seconds)" -v e="$(field "$j" epoch)" \
      'BEGIN{printf "    grad check (honest 1): %d checks, %d failed, %.3f s per round re-computing, own compute %.3f s per epoch (x%.2f)\n", c, f, (r > 0 ? gs / r : 0), (e > 0 ? (s - st) / e : 0), ((s - st) > 0 && r > 0 && e > 0 ? (gs / r) / ((s - st) / e) : 0)}' >&2
  fi
  printf '%s\n' "${accs[@]}" | sort -g | sed -n '1p;$p' | tr '\n' ' '
  echo "$(printf '%s\n' "${hashes[@]}" | sort -u | wc -l) $banned_all $honest_bans $rounds $med"
}

declare -A clean_acc
row() {  # row LABEL AGG ATTACK_KIND RESULT_FIELDS...
  local label=$1 agg=$2 kind=$3 lo=$4 hi=$5 hs=$6 ball=$7 hb=$8 rd=$9 med=${10}
  local ref=${clean_acc[$agg]:-$lo} ratio
  ratio=$(awk -v a="$lo" -v r="$ref" 'BEGIN{printf "%.3f", (r > 0 ? a / r : 0)}')
  printf '  %-16s %-20s %8s %8s %8s %7s %8s %7s %7s %9s\n' "$label" "$agg" "$lo" "$hi" "$ratio" \
    "$hs" "$ball" "$hb" "$rd" "$med"
  echo "RESULT {\"bench\":\"byzantine\",\"attack\":\"$kind\",\"aggregation\":\"$agg\",\"peers\":$peers,\"attackers\":$([[ $kind == none ]] && echo 0 || echo "$attackers"),\"epochs\":$epochs,\"worker_momentum\":$([[ $agg == mean ]] && echo 0 || echo "$wm"),\"acc_min\":$lo,\"acc_max\":$hi,\"acc_ratio_to_clean\":$ratio,\"distinct_hashes\":$hs,\"all_attackers_banned\":\"$ball\",\"honest_bans\":$hb,\"rounds_to_ban\":$rd,\"allreduce_median_s\":$med,\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >> "$dir/results"
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "hostile peers: $peers peers, $attackers attacking, $epochs epochs, centered-clip with worker momentum $wm, load before: $load0"
printf '  %-16s %-20s %8s %8s %8s %7s %8s %7s %7s %9s\n' attack aggregation "acc min" "acc max" \
  "vs clean" hashes banned "h.bans" "a.rounds" "ar med s"
read -r lo hi hs ball hb rd med < <(run clean-mean 0 none)
clean_acc[mean]=$lo
row "none (clean)" mean none "$lo" "$hi" "$hs" "$ball" "$hb" "$rd" "$med"
clean_mean_med=$med
read -r lo hi hs ball hb rd med < <(run clean-cc 0 none --aggregation centered-clip --worker-momentum "$wm")
row "none (clean)" centered-clip none "$lo" "$hi" "$hs" "$ball" "$hb" "$rd" "$med"
clean_cc_med=$med
read -r lo hi hs ball hb rd med < <(run clean-clip 0 none "${clip[@]}")
clean_acc[centered-clip+verify]=$lo
row "none (clean)" centered-clip+verify none "$lo" "$hi" "$hs" "$ball" "$hb" "$rd" "$med"
clean_clip_med=$med
for a in $attacks; do
  case $a in
    wrong-average | different-parts | false-report | directory-lie | stall) ;;
    *)
      read -r lo hi hs ball hb rd med < <(run "$a-mean" "$attackers" "$a")
      row "$a" mean "$a" "$lo" "$hi" "$hs" "$ball" "$hb" "$rd" "$med"
      ;;
  esac
  read -r lo hi hs ball hb rd med < <(run "$a-clip" "$attackers" "$a" "${clip[@]}")
  row "$a" centered-clip+verify "$a" "$lo" "$hi" "$hs" "$ball" "$hb" "$rd" "$med"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", (b > 0 ? a / b : 0)}'; }
echo "  clean all-reduce median: mean $clean_mean_med s, centered-clip $clean_cc_med s, centered-clip+verify $clean_clip_med s (verify: x$(ratio "$clean_clip_med" "$clean_cc_med"), both: x$(ratio "$clean_clip_med" "$clean_mean_med"))"
echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "$dir/results"
if [[ -n ${LOGDIR:-} ]]; then mkdir -p "$LOGDIR" && cp "$dir"/*.log "$dir"/*.json "$LOGDIR"/; fi
