# Sourced by the demo and benchmark scripts.
#
# demo_workdir: sets `dir` (a new temporary directory) and `pids` (empty); at exit every pid in
# `pids` is killed, and the directory is removed after a success or kept (and named) after a
# failure.
demo_workdir() {
  dir=$(mktemp -d)
  pids=()
  trap demo_cleanup EXIT
}
demo_cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if ((rc == 0)); then rm -rf "$dir"; else echo "== logs of the failed run kept in $dir"; fi
}
#
# start_bootstrap BIN DIR: starts a `starling dht`
# bootstrap node on loopback (port 0) in the background with its files in DIR, appends its pid
# to the caller's `pids` array and sets `boot_pid`, waits up to 10 s for its address and sets
# `boot` (exits with the node's log if it did not start).
start_bootstrap() {
  local bin=$1 d=$2
  "$bin" dht --identity "$d/boot.key" --listen /ip4/127.0.0.1/tcp/0 --addr-file "$d/boot.addrs" \
    > "$d/boot.log" 2>&1 &
  boot_pid=$!
  pids+=("$boot_pid")
  for _ in $(seq 100); do [[ -s $d/boot.addrs ]] && break; sleep 0.1; done
  [[ -s $d/boot.addrs ]] || { echo "bootstrap node did not start"; cat "$d/boot.log"; exit 1; }
  boot=$(head -1 "$d/boot.addrs")
}

# wait_trainers LIMIT T0 I...: waits for the trainers whose pids are ${tpid[I]} (the caller's
# associative array; logs in $dir/tI.log) to exit, until LIMIT seconds after T0 in all;
# exits with the trainer's log tail if one is still running then or failed.
wait_trainers() {
  local limit=$1 t0=$2 i left
  shift 2
  for i in "$@"; do
    left=$((limit - ($(date +%s) - t0)))
    ((left > 0)) || left=1
    if ! timeout "$left" tail --pid="${tpid[$i]}" -f /dev/null; then
      echo "trainer $i still running at the time limit"; tail -5 "$dir/t$i.log"; exit 1
    fi
    wait "${tpid[$i]}" || { echo "trainer $i failed"; tail -20 "$dir/t$i.log"; exit 1; }
  done
}
