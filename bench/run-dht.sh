#!/usr/bin/env bash
# make bench-dht: Starling's DHT vs OpenDHT, same node count, same operations, same run.
# N nodes on loopback, split over worker processes of BENCH_PER_PROC nodes (both systems: one
# process cannot hold them all: Starling needs a TCP connection per peer pair against the 20000
# fd limit, OpenDHT's select() dies above fd 1024). Store a 64-byte value through a random node,
# store it again (new value, same node), get it through another, stop 30% of the nodes, get
# every key again. Prints a table (quantiles with their distribution-free 95% intervals; CPU
# all workers used per operation; connections the operating node opened) and one
# `RESULT {json}` line. BENCH_NODES (default 256), BENCH_OPS (default 300: enough for the
# median's interval to be a few percent wide), BENCH_PER_PROC (default 64) change the size;
# BENCH_ROUNDS (default 2) runs both systems that many times in alternating order.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin=$build/bin/bench_dht
nodes=${BENCH_NODES:-256}
ops=${BENCH_OPS:-300}
per_proc=${BENCH_PER_PROC:-64}
[[ -x $bin ]] || { echo "bench_dht not built (needs libopendht-dev)"; exit 1; }
rounds=${BENCH_ROUNDS:-2}
ratio() { jq -n "($1 | tonumber) / ([($2 | tonumber), 0.001] | max)"; }
load=$(cut -d' ' -f1 /proc/loadavg)
# Rounds alternate the order (S O, O S, ...) so that a load that drifts during the run weighs
# on both systems alike; every figure below is the mean over the rounds.
one() { "$bin" "$1" --nodes "$nodes" --ops "$ops" --per-proc "$per_proc" | tail -1; }
ss=() os=()
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then ss+=("$(one starling)"); os+=("$(one opendht)")
  else os+=("$(one opendht)"); ss+=("$(one starling)"); fi
done
load_end=$(cut -d' ' -f1 /proc/loadavg)
mean='def m: if (.[0] | type) == "object" then . as $a | reduce (.[0] | keys[]) as $k ({}; .[$k] = ([$a[][$k]] | m))
  elif (.[0] | type) == "number" then add / length else .[0] end; m'
s=$(printf '%s\n' "${ss[@]}" | jq -cs "$mean")
o=$(printf '%s\n' "${os[@]}" | jq -cs "$mean")
printf "%s nodes in %s processes, %s keys, loopback, %s rounds, load %s at start, %s at end\n" \
  "$nodes" "$(jq .procs <<< "$s")" "$ops" "$rounds" "$load" "$load_end"
for ((r = 0; r < rounds; r++)); do
  a=$(jq .get.p50_ms <<< "${ss[r]}"); b=$(jq .get.p50_ms <<< "${os[r]}")
  printf "round %d (%s first): get p50 %.3f vs %.3f ms, ratio %.2f\n" $((r + 1)) \
    "$( ((r % 2)) && echo opendht || echo starling)" "$a" "$b" "$(ratio "$a" "$b")"
done
echo "(below: the mean of the rounds)"
printf "%-28s %12s %12s %10s\n" "" "starling" "opendht" "ratio s/o"
ci() { jq -r ".$2 | \"\(.p50_lo_ms * 100 | round / 100)-\(.p50_hi_ms * 100 | round / 100)\"" <<< "$1"; }
for op in store store_again get get_after_churn; do
  for q in p50_ms p90_ms p99_ms mean_ms; do
    a=$(jq ".$op.$q" <<< "$s"); b=$(jq ".$op.$q" <<< "$o")
    printf "%-28s %12.2f %12.2f %10.2f\n" "$op $q" "$a" "$b" "$(ratio "$a" "$b")"
  done
  # The ratio of medians as far as both 95% intervals allow: [s_lo / o_hi, s_hi / o_lo].
  lo=$(ratio "$(jq ".$op.p50_lo_ms" <<< "$s")" "$(jq ".$op.p50_hi_ms" <<< "$o")")
  hi=$(ratio "$(jq ".$op.p50_hi_ms" <<< "$s")" "$(jq ".$op.p50_lo_ms" <<< "$o")")
  printf "%-28s %12s %12s %10s\n" "$op p50 95% interval" "$(ci "$s" "$op")" "$(ci "$o" "$op")" \
    "$(printf "%.2f-%.2f" "$lo" "$hi")"
  printf "%-28s %12.3f %12.3f\n" "$op success" "$(jq ".$op.success" <<< "$s")" "$(jq ".$op.success" <<< "$o")"
  printf "%-28s %12.2f %12.2f %10.2f\n" "$op CPU ms/op (all nodes)" "$(jq ".$op.cpu_ms_per_op" <<< "$s")" \
    "$(jq ".$op.cpu_ms_per_op" <<< "$o")" \
    "$(ratio "$(jq ".$op.cpu_ms_per_op" <<< "$s")" "$(jq ".$op.cpu_ms_per_op" <<< "$o")")"
  printf "%-28s %12.2f %12s\n" "$op connections opened/op" "$(jq ".$op.dials_per_op" <<< "$s")" "-"
done
printf "%-28s %12.2f %12.2f\n" "idle CPU after join (cores)" "$(jq .idle_cores <<< "$s")" "$(jq .idle_cores <<< "$o")"
printf "%-28s %12.0f %12.0f\n" "KiB per node" "$(jq .kib_per_node <<< "$s")" "$(jq .kib_per_node <<< "$o")"
printf "%-28s %12.0f %12.0f\n" "fds, busiest process" "$(jq .max_fds_per_proc <<< "$s")" \
  "$(jq .max_fds_per_proc <<< "$o")"
printf "%-28s %12.1f %12.1f\n" "setup (join) s" "$(jq .setup_s <<< "$s")" "$(jq .setup_s <<< "$o")"
echo "RESULT $(jq -cn --argjson s "$s" --argjson o "$o" --arg load "$load" --arg load_end "$load_end" \
  --argjson rs "$(printf '%s\n' "${ss[@]}" | jq -cs '[.[].get.p50_ms]')" \
  --argjson ro "$(printf '%s\n' "${os[@]}" | jq -cs '[.[].get.p50_ms]')" \
  '{bench:"dht", nodes:$s.nodes, ops:$s.ops, procs:$s.procs, rounds:($rs|length), load:($load|tonumber), load_end:($load_end|tonumber), starling:$s, opendht:$o,
    get_p50_rounds:{starling:$rs, opendht:$ro},
    ratio_get_p50:($s.get.p50_ms / $o.get.p50_ms),
    ratio_get_p50_interval:[($s.get.p50_lo_ms / $o.get.p50_hi_ms), ($s.get.p50_hi_ms / $o.get.p50_lo_ms)],
    ratio_get_p99:($s.get.p99_ms / $o.get.p99_ms), ratio_store_p50:($s.store.p50_ms / $o.store.p50_ms),
    ratio_get_after_churn_p50:($s.get_after_churn.p50_ms / $o.get_after_churn.p50_ms)}')"
