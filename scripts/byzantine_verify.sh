#!/usr/bin/env bash
# Accountability against cheating owners and senders (docs/security.md): a `starling dht`
# bootstrap node, 4 honest `starling train --verify` peers and ATTACKERS peers with
# `--verify --attack KIND` (wrong-average: as an owner, returns shifted averages;
# different-parts: sends one owner other values than it committed; false-report: lies in its
# projection reports so that honest owners fail the check) train the Fashion-MNIST MLP for
# EPOCHS epochs with centered-clip. CenteredClip cannot stop these cheats; the accountability
# protocol must ban the cheater and no honest peer. Prints, per honest peer, its test accuracy, parameter
# hash and the peers it banned, and one line `RESULT {json}`.
# With CHECK=1 (ctest byzantine_verify) it fails unless every honest peer banned every
# attacker, no honest peer banned an honest one, the honest peers' parameters are identical
# and their accuracy is >= MIN_ACC (0.75).
# With GRAD_CHECK=K every peer runs the gradient check (--grad-check K: K members drawn per
# round are re-computed by every member), which catches gradient attacks (label-flip,
# sign-flip, random, alie); the epoch of each honest peer's first failed check and its time
# spent re-computing are printed too.
# Usage: scripts/byzantine_verify.sh [BUILD]
#   (env: EPOCHS (10), ATTACK (wrong-average), ATTACKERS (1), MIN_ACC (0.75), GRAD_CHECK (0))
set -euo pipefail
build=${1:-build}
bin=$build/bin/starling
epochs=${EPOCHS:-10}
attack=${ATTACK:-wrong-average}
attackers=${ATTACKERS:-1}
min_acc=${MIN_ACC:-0.75}
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap_node.sh"
demo_workdir
field() { sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[0-9.e+-]*\).*/\1/p" "$1" | tr -d '"'; }
start_bootstrap "$bin" "$dir"
common=(--initial-peers "$boot" --listen /ip4/127.0.0.1/tcp/0 --target-batch-size 1024
        --batch-size 64 --threads 1 --lr 0.003 --max-epochs "$epochs" --linger 20 --no-metrics
        --aggregation centered-clip --verify --run-id byz-verify)
grad_check=${GRAD_CHECK:-0}
((grad_check == 0)) || common+=(--grad-check "$grad_check")
load0=$(cut -d' ' -f1-3 /proc/loadavg)
honest_ids=() bad_ids=() ps=() honest=()
for i in 1 2 3 4; do
  honest_ids+=("$("$bin" id --identity "$dir/h$i.key")")
  "$bin" train --identity "$dir/h$i.key" "${common[@]}" --report "$dir/h$i.json" \
    > "$dir/h$i.log" 2>&1 &
  ps+=($!); honest+=($!); pids+=($!)
done
for a in $(seq "$attackers"); do
  bad_ids+=("$("$bin" id --identity "$dir/a$a.key")")
  "$bin" train --identity "$dir/a$a.key" "${common[@]}" --attack "$attack" \
    --report "$dir/a$a.json" > "$dir/a$a.log" 2>&1 &
  ps+=($!); pids+=($!)
done
for p in "${honest[@]}"; do wait "$p" || true; done
for p in "${ps[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${ps[@]}"; do wait "$p" 2>/dev/null || true; done

echo "training with $attackers peer(s) cheating (--attack $attack) among 4 honest ones, --verify, $epochs epochs, load before: $load0"
ok=1 accs=() hashes=() all_banned=1 honest_bans=0
for i in 1 2 3 4; do
  log=$dir/h$i.log
  acc=0 hash=none
  if [[ -s $dir/h$i.json ]]; then
    acc=$(field "$dir/h$i.json" test_accuracy)
    hash=$(field "$dir/h$i.json" param_hash)
  fi
  accs+=("$acc"); hashes+=("$hash")
  caught=0
  for b in "${bad_ids[@]}"; do grep -q "banned peer $b" "$log" && caught=$((caught + 1)); done
  ((caught == attackers)) || all_banned=0
  for h in "${honest_ids[@]}"; do grep -q "banned peer $h" "$log" && honest_bans=$((honest_bans + 1)); done
  first=$(grep -m1 "banned peer" "$log" | cut -c1-12 || true)
  # Evidence this peer found itself before its first ban (wrong-average: one per round with
  # the cheater owning a part; different-parts: only the cheated owner finds it).
  found=$(awk '/banned peer/{exit} /found .* evidence/{n++} END{print n+0}' "$log")
  printf '  honest %d: accuracy %-8s params %-18s attackers banned %d/%d (first ban at %s, after %d own findings)\n' \
    "$i" "$acc" "${hash:0:16}" "$caught" "$attackers" "${first:-never}" "$found"
  if ((grad_check > 0)) && [[ -s $dir/h$i.json ]]; then
    failed_at=$(sed -n 's/.*epoch \([0-9]*\): gradient check of peer .* failed.*/\1/p' "$log" | head -1)
    printf '    gradient check: %s checks, %s failed (first at epoch %s), %.2f s re-computing of %.1f s in step()\n' \
      "$(field "$dir/h$i.json" grad_checks)" "$(field "$dir/h$i.json" grad_check_failures)" \
      "${failed_at:-none}" "$(field "$dir/h$i.json" grad_check_seconds)" \
      "$(field "$dir/h$i.json" step_seconds)"
  fi
done
distinct=$(printf '%s\n' "${hashes[@]}" | sort -u | wc -l)
acc_lo=$(printf '%s\n' "${accs[@]}" | sort -g | head -1)
echo "  honest peers banned by honest peers: $honest_bans; distinct honest parameter hashes: $distinct"
echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "RESULT {\"bench\":\"byzantine_verify\",\"grad_check\":$grad_check,\"attack\":\"$attack\",\"attackers\":$attackers,\"epochs\":$epochs,\"honest_acc_min\":$acc_lo,\"all_attackers_banned\":$all_banned,\"honest_bans\":$honest_bans,\"distinct_hashes\":$distinct,\"load_before\":\"$load0\"}"
if [[ ${CHECK:-0} == 1 ]]; then
  ((all_banned == 1)) || { echo "an honest peer did not ban every attacker"; ok=0; }
  ((honest_bans == 0)) || { echo "an honest peer was banned"; ok=0; }
  [[ $distinct == 1 ]] || { echo "honest peers' parameters differ"; ok=0; }
  awk -v a="$acc_lo" -v m="$min_acc" 'BEGIN{exit !(a >= m)}' ||
    { echo "an honest peer at accuracy $acc_lo < $min_acc"; ok=0; }
  ((ok == 1)) || exit 1
  echo "byzantine_verify: checks passed"
fi
