#!/usr/bin/env bash
# make bench-transport: Starling's encrypted yamux streams vs raw TCP (iperf3), same run,
# two processes on loopback. Prints a table and one `RESULT {json}` line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin=$build/bin/bench_transport
secs=${BENCH_SECONDS:-3}
mib=${BENCH_MIB:-1024}
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

port=$("$bin" freeport)
iperf3 -s -p "$port" > /dev/null 2>&1 & pids+=($!)
# Readiness probe: a 1 KB transfer (iperf3 treats a fractional -t as 0, i.e. "forever").
for _ in $(seq 50); do timeout 5 iperf3 -c 127.0.0.1 -p "$port" -n 1K > /dev/null 2>&1 && break; sleep 0.1; done
lim=$((secs * 4 + 60))  # every step is bounded
iperf1=$(timeout $lim iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -J | jq '.end.sum_received.bits_per_second / 1e9')
iperf8=$(timeout $lim iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -P 8 -J | jq '.end.sum_received.bits_per_second / 1e9')

"$bin" serve --addr-file "$dir/addr" & pids+=($!)
for _ in $(seq 100); do [[ -s $dir/addr ]] && break; sleep 0.1; done
addr=$(cat "$dir/addr")
s1=$(timeout 300 "$bin" stream "$addr" --mib "$mib" --streams 1)
s8=$(timeout 300 "$bin" stream "$addr" --mib "$mib" --streams 8)
r1=$(timeout 300 "$bin" rpc "$addr" --calls 5000 --concurrency 1)
r16=$(timeout 300 "$bin" rpc "$addr" --calls 20000 --concurrency 16)
u1=$(timeout 300 "$bin" unary "$addr" --calls 3000 --concurrency 1)
u16=$(timeout 300 "$bin" unary "$addr" --calls 10000 --concurrency 16)

ciph=$(timeout 300 "$bin" cipher --mib 512)
g1=$(jq .gbit_s <<< "$s1"); g8=$(jq .gbit_s <<< "$s8")
ratio1=$(jq -n "$g1 / $iperf1"); ratio8=$(jq -n "$g8 / $iperf8")
printf "%-34s %10s %10s %8s\n" "loopback, 2 processes" "starling" "iperf3" "ratio"
printf "%-34s %10.2f %10.2f %8.2f\n" "1 stream (Gbit/s)" "$g1" "$iperf1" "$ratio1"
printf "%-34s %10.2f %10.2f %8.2f\n" "8 streams (Gbit/s)" "$g8" "$iperf8" "$ratio8"
printf "ChaChaPoly on one core (ceiling for one stream): seal %.2f Gbit/s, open %.2f Gbit/s\n" \
  "$(jq .seal_gbit_s <<< "$ciph")" "$(jq .open_gbit_s <<< "$ciph")"
printf "load average while measuring: %s\n" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf "small request/response, 1 caller:   p50 %.1f us  p99 %.1f us  %.0f calls/s\n" \
  "$(jq .p50_us <<< "$r1")" "$(jq .p99_us <<< "$r1")" "$(jq .calls_per_s <<< "$r1")"
printf "small request/response, 16 callers: p50 %.1f us  p99 %.1f us  %.0f calls/s\n" \
  "$(jq .p50_us <<< "$r16")" "$(jq .p99_us <<< "$r16")" "$(jq .calls_per_s <<< "$r16")"
printf "typed unary RPC (stream per call), 1 caller:   p50 %.1f us  p99 %.1f us  %.0f calls/s\n" \
  "$(jq .p50_us <<< "$u1")" "$(jq .p99_us <<< "$u1")" "$(jq .calls_per_s <<< "$u1")"
printf "typed unary RPC (stream per call), 16 callers: p50 %.1f us  p99 %.1f us  %.0f calls/s\n" \
  "$(jq .p50_us <<< "$u16")" "$(jq .p99_us <<< "$u16")" "$(jq .calls_per_s <<< "$u16")"
load=$(cut -d' ' -f1 /proc/loadavg)
echo "RESULT $(jq -cn --argjson load "$load" --argjson s1 "$s1" --argjson s8 "$s8" --argjson r1 "$r1" --argjson r16 "$r16" --argjson u1 "$u1" --argjson u16 "$u16" --argjson ciph "$ciph" \
  --argjson i1 "$iperf1" --argjson i8 "$iperf8" --argjson q1 "$ratio1" --argjson q8 "$ratio8" \
  '{bench:"transport", one_stream_gbit_s:$s1.gbit_s, iperf3_one_gbit_s:$i1, ratio_one:$q1,
    eight_streams_gbit_s:$s8.gbit_s, iperf3_eight_gbit_s:$i8, ratio_eight:$q8,
    reqresp_1:$r1, reqresp_16:$r16, unary_rpc_1:$u1, unary_rpc_16:$u16, cipher_one_core:$ciph,
    load:$load}')"
