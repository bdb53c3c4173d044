#!/usr/bin/env bash
# make bench-allreduce: all-reduce of 64 MiB of float32 among 2, 4 and 8 processes on loopback,
# Starling (Noise-encrypted yamux streams, butterfly reduce-scatter + all-gather) beside Gloo's
# ring all-reduce (TCP transport, Debian's libgloo-dev), same run, same sizes. A round's time is
# the slowest process's; the table shows the median over BENCH_ITERS rounds and the ratios
# starling/gloo (< 1: Starling faster), without compression and with 8-bit compression; "views"
# is the same uncompressed round through the averager's own tensors (gather + scatter copies), so
# "starling" vs "views" is what handing the round flat buffers saves;
# (blockwise8 on the wire, BENCH_CODEC to change it). Load-independent columns: the busiest
# process's CPU seconds per round (median) for Starling and Gloo, and the cipher floor: the CPU
# seconds one core needs just to seal and open what a Starling member moves in a round.
#
# Then the emulated internet (needs root and network namespaces; skipped with a message
# otherwise, or with BENCH_NETLAB=0): 4 hosts with 100 Mbit/s links in tools/netlab, Starling
# and Gloo, each against the bound 2*(n-1)/n*size/bandwidth (what any all-reduce must move
# through each link). `--netlab` runs only that part. Every process is bounded by `timeout`.
#
# Environment: BENCH_SIZES ("2 4 8"), BENCH_ELEMS (16777216), BENCH_ITERS (3),
# BENCH_CODEC (blockwise8), BENCH_NETLAB (1), BENCH_NETLAB_MBIT (100),
# BENCH_NETLAB_ITERS (2), BENCH_NETLAB_TRACE (a directory: per-link rates every 100 ms and
# the processes' debug logs of the emulated-internet run, for a time series), BENCH_NETLAB_GLOO (1; 0 skips Gloo there),
# BENCH_STARLING_ARGS (extra bench_allreduce options there, e.g. --balance-slack 0),
# BENCH_NETLAB_CAP_PCT (0; if set, an extra Starling row whose processes cap their upload at this
# percent of the link, bench_allreduce --max-upload, with a BENCH_NETLAB_CAP_BURST (65536)
# byte bucket: the host's default burst, 100 ms of the rate, fills the link's queue),
# BENCH_NETLAB_UNPACED (1; an extra Starling row without the round's upload pacing,
# --upload-pace 0, as before it was the default; 0 skips it). Ends with one `RESULT {json}` line (loopback rows under "results",
# the emulated internet under "netlab").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
mode=${2:-loopback}
[[ $build == --netlab ]] && { mode=--netlab; build="${2:-$root/build}"; }
here=$(cd "$(dirname "$0")" && pwd)
star=$build/bin/bench_allreduce
gloo=$build/bin/gloo_allreduce
elems=${BENCH_ELEMS:-16777216}
iters=${BENCH_ITERS:-3}
codec=${BENCH_CODEC:-blockwise8}
sizes=${BENCH_SIZES:-"2 4 8"}
for b in "$star" "$gloo"; do
  [[ -x $b ]] || { echo "missing $b (build the bench targets first)" >&2; exit 1; }
done
tmp=$(mktemp -d)
pids=()
netlab_name=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n $netlab_name ]] && "$here/../tools/netlab/netlab" down --name "$netlab_name" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT

# run_group OUT N LAUNCH...: starts N ranks (LAUNCH gets the rank appended as $r via a function),
# waits, and writes the per-round max over ranks' times (the round time) as a JSON array to OUT.
run_group() {
  local out=$1 n=$2 launcher=$3
  local d
  d=$(mktemp -d "$tmp/run.XXXX")
  last_run_dir=$d
  pids=()
  for r in $(seq 0 $((n - 1))); do
    "$launcher" "$r" "$n" "$d" > "$d/out.$r" 2> "$d/err.$r" &
    pids+=($!)
  done
  local fail=0
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  pids=()
  if ((fail)); then
    echo "a process of $launcher failed:" >&2
    tail -n 5 "$d"/err.* >&2
    return 1
  fi
  jq -s '[.[].times_s] | transpose | map(max)' "$d"/out.* > "$out"
  # Per round, the busiest process's CPU seconds; and the cipher floor (bench_allreduce only).
  jq -s '[.[].cpu_per_round_s // []] | transpose | map(max)' "$d"/out.* > "$out.cpu"
  jq -s 'map(.cipher_floor_s // empty) | max' "$d"/out.* > "$out.floor"
}

median() { jq 'sort | .[(length / 2 | floor)]' "$1"; }

star_local() { timeout "$limit" "$star" --rank "$1" --size "$2" --dir "$3/dir" --elems "$elems" --iters "$iters"; }
# The same round through the averager's own tensors (gather before, scatter after: what every
# step paid before steps took the caller's flat buffers).
star_views() {
  timeout "$limit" "$star" --rank "$1" --size "$2" --dir "$3/dir" --elems "$elems" --iters "$iters" --flat 0
}
star_codec() {
  timeout "$limit" "$star" --rank "$1" --size "$2" --dir "$3/dir" --elems "$elems" --iters "$iters" --codec "$codec"
}
gloo_local() { timeout "$limit" "$gloo" --rank "$1" --size "$2" --dir "$3" --elems "$elems" --iters "$iters"; }

bytes=$((elems * 4))
limit=${BENCH_PROCESS_TIMEOUT:-300}  # seconds per process (all rounds)
loopback_json=null
if [[ $mode != --netlab ]]; then
  rows=()
  printf "%-24s %11s %11s %11s %11s %8s %8s %9s %9s %9s %9s\n" "$((bytes >> 20)) MiB float32, loopback" \
    "starling s" "views s" "$codec s" "gloo s" "ratio" "ratio8" "cpu s" "views cpu" "gloo cpu" "floor s"
  for n in $sizes; do
    run_group "$tmp/s$n" "$n" star_local
    run_group "$tmp/v$n" "$n" star_views
    run_group "$tmp/c$n" "$n" star_codec
    run_group "$tmp/g$n" "$n" gloo_local
    s=$(median "$tmp/s$n")
    c=$(median "$tmp/c$n")
    v=$(median "$tmp/v$n")
    vcpu=$(median "$tmp/v$n.cpu")
    g=$(median "$tmp/g$n")
    ratio=$(jq -n "$s / $g")
    ratio8=$(jq -n "$c / $g")
    scpu=$(median "$tmp/s$n.cpu")
    gcpu=$(median "$tmp/g$n.cpu")
    floor=$(cat "$tmp/s$n.floor")
    printf "%-24s %11.3f %11.3f %11.3f %11.3f %8.2f %8.2f %9.3f %9.3f %9.3f %9.3f\n" "$n processes" \
      "$s" "$v" "$c" "$g" "$ratio" "$ratio8" "$scpu" "$vcpu" "$gcpu" "$floor"
    rows+=("$(jq -cn --argjson n "$n" --argjson s "$s" --argjson c "$c" --argjson g "$g" \
      --argjson q "$ratio" --argjson q8 "$ratio8" \
      --argjson sc "$scpu" --argjson gc "$gcpu" --argjson fl "$floor" \
      --argjson v "$v" --argjson vc "$vcpu" \
      --slurpfile st "$tmp/s$n" --slurpfile ct "$tmp/c$n" --slurpfile gt "$tmp/g$n" \
      '{processes:$n, starling_s:$s, starling_views_s:$v, starling_views_cpu_per_round_s:$vc,
        starling_compressed_s:$c, gloo_s:$g, ratio:$q,
        starling_cpu_per_round_s:$sc, gloo_cpu_per_round_s:$gc, cipher_floor_cpu_s:$fl,
        ratio_compressed:$q8, starling_rounds_s:$st[0], starling_compressed_rounds_s:$ct[0],
        gloo_rounds_s:$gt[0]}')")
  done
  loopback_json=$(printf '%s\n' "${rows[@]}" | jq -cs .)
  loopback_load=$(cut -d' ' -f1-3 /proc/loadavg)
fi

finish() {  # finish NETLAB_JSON: the one RESULT line
  echo "RESULT $(jq -cn --argjson b "$bytes" --arg c "$codec" --argjson r "$loopback_json" \
    --arg load "${loopback_load:-}" --argjson nl "$1" \
    '{bench:"allreduce", bytes:$b, codec:$c, loadavg:$load, results:$r, netlab:$nl}')"
  exit 0
}

# --- emulated internet ---
nl=$here/../tools/netlab/netlab
if [[ ${BENCH_NETLAB:-1} == 0 ]]; then
  echo "emulated internet: skipped (BENCH_NETLAB=0)"
  finish '{"skipped":"BENCH_NETLAB=0"}'
fi
if [[ ! -x $nl ]]; then
  echo "emulated internet: skipped (tools/netlab is not in this tree)"
  finish '{"skipped":"no tools/netlab"}'
fi
if ! "$nl" check >/dev/null 2>&1; then
  echo "emulated internet: skipped (netlab needs root and network namespaces, not available here)"
  finish '{"skipped":"netlab unavailable (root and network namespaces needed)"}'
fi
mbit=${BENCH_NETLAB_MBIT:-100}
iters=${BENCH_NETLAB_ITERS:-2}
n=4
netlab_name=$("$nl" up --hosts "$n" --up-mbit "$mbit" --down-mbit "$mbit")
export NETLAB_NAME=$netlab_name
star_lab() {
  local ip
  ip=$("$nl" addr "h$(($1 + 1))")
  timeout "$limit" "$nl" exec "h$(($1 + 1))" -- "$star" --rank "$1" --size "$2" --dir "$3/dir" --elems "$elems" \
    --iters "$iters" --listen "/ip4/$ip/tcp/0" --bandwidth $((mbit * 125000)) ${star_extra:-} ${BENCH_STARLING_ARGS:-}
}
cap_pct=${BENCH_NETLAB_CAP_PCT:-0}
gloo_lab() {
  local ip
  ip=$("$nl" addr "h$(($1 + 1))")
  timeout "$limit" "$nl" exec "h$(($1 + 1))" -- "$gloo" --rank "$1" --size "$2" --dir "$3" --elems "$elems" \
    --iters "$iters" --host "$ip"
}
# BENCH_NETLAB_TRACE=DIR: a time series of Starling's rounds in DIR: every link's rate every
# 100 ms (tools/netlab/linkwatch, wall-clock ms) and each process's debug log (phase times).
trace=${BENCH_NETLAB_TRACE:-}
if [[ -n $trace ]]; then
  mkdir -p "$trace"
  export STARLING_LOG=debug
  "$here/../tools/netlab/linkwatch" --name "$netlab_name" --duration-s "$limit" \
    --out "$trace/links.txt" &
  watch_pid=$!
fi
run_group "$tmp/ls" "$n" star_lab
if [[ -n $trace ]]; then
  kill "$watch_pid" 2>/dev/null || true
  unset STARLING_LOG
  cp "$last_run_dir"/out.* "$last_run_dir"/err.* "$trace"/
fi
if [[ $cap_pct != 0 ]]; then  # the same with each process's upload capped below the link
  star_extra="--max-upload $((mbit * 125000 * cap_pct / 100)) --upload-burst ${BENCH_NETLAB_CAP_BURST:-65536}"
  run_group "$tmp/lc" "$n" star_lab
  star_extra=""
else
  echo '[0]' > "$tmp/lc"
fi
if [[ ${BENCH_NETLAB_UNPACED:-1} != 0 ]]; then  # the same without the round's pacing
  star_extra="--upload-pace 0"
  run_group "$tmp/lu" "$n" star_lab
  star_extra=""
else
  echo '[0]' > "$tmp/lu"
fi
if [[ ${BENCH_NETLAB_GLOO:-1} == 0 ]]; then  # Starling alone (A/B runs)
  echo '[0]' > "$tmp/lg"
else
  run_group "$tmp/lg" "$n" gloo_lab
fi
s=$(median "$tmp/ls")
g=$(median "$tmp/lg")
sc=$(median "$tmp/lc")
su=$(median "$tmp/lu")
bound=$(jq -n "2 * ($n - 1) / $n * $bytes * 8 / ($mbit * 1e6)")
printf "%-34s %10s %10s %10s\n" "$n hosts, ${mbit} Mbit/s links" "time s" "bound s" "of bound"
printf "%-34s %10.2f %10.2f %9.0f%%\n" "starling" "$s" "$bound" "$(jq -n "100 * $bound / $s")"
[[ $sc == 0 ]] ||
  printf "%-34s %10.2f %10.2f %9.0f%%\n" "starling, upload capped ${cap_pct}%" "$sc" "$bound" \
    "$(jq -n "100 * $bound / $sc")"
[[ $su == 0 ]] ||
  printf "%-34s %10.2f %10.2f %9.0f%%\n" "starling, not paced" "$su" "$bound" \
    "$(jq -n "100 * $bound / $su")"
[[ $g == 0 ]] ||
  printf "%-34s %10.2f %10.2f %9.0f%%\n" "gloo ring" "$g" "$bound" "$(jq -n "100 * $bound / $g")"
echo "load average after the emulated-internet run: $(cut -d' ' -f1-3 /proc/loadavg)"
finish "$(jq -cn --argjson s "$s" --argjson g "$g" --argjson b "$bound" --argjson m "$mbit" \
  --argjson sc "$sc" --argjson cp "$cap_pct" --slurpfile ct "$tmp/lc" \
  --argjson su "$su" --slurpfile ut "$tmp/lu" \
  --arg load "$(cut -d' ' -f1-3 /proc/loadavg)" --slurpfile st "$tmp/ls" --slurpfile gt "$tmp/lg" \
  '{hosts:4, link_mbit:$m, codec:"none", starling_s:$s, gloo_s:$g, bound_s:$b,
    starling_fraction_of_bound:($b / $s), gloo_fraction_of_bound:(if $g > 0 then $b / $g else null end),
    starling_capped_pct:$cp, starling_capped_s:$sc,
    starling_capped_fraction_of_bound:(if $sc > 0 then $b / $sc else null end),
    starling_unpaced_s:$su, starling_unpaced_rounds_s:$ut[0],
    starling_rounds_s:$st[0], starling_capped_rounds_s:$ct[0], gloo_rounds_s:$gt[0], loadavg:$load}')"
