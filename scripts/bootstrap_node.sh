# Sourced by the demo and benchmark scripts. start_bootstrap BIN DIR: starts a `starling dht`
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
