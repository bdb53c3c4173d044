# Shared by the shell tests, the demo and the benchmark scripts (sourced, bash): a work directory
# kept when the script fails, background processes that never outlive the script, and bounded
# waits. After `st_init`: $dir is the work directory and `st_bg LOG CMD...` starts CMD in the
# background (its pid is appended to the array `pids` and left in $st_pid).

# st_init: creates $dir and installs the exit trap.
st_init() {
  dir=$(mktemp -d "${TMPDIR:-/tmp}/starling-$(basename "$0" .sh).XXXXXX")
  pids=()
  trap st_cleanup EXIT
}

# The exit trap: TERM every background process, KILL what is left after 5 s, then remove $dir
# on success or keep it (and say where) on failure.
st_cleanup() {
  local rc=$? p
  set +e
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  if ((rc == 0 || rc == 77)); then rm -rf "$dir"; else echo "# logs kept in $dir" >&2; fi
  exit "$rc"
}

# st_bg LOG CMD...: runs CMD in the background with stdout and stderr in LOG.
st_bg() {
  local log=$1
  shift
  "$@" > "$log" 2>&1 &
  st_pid=$!
  pids+=("$st_pid")
}

# st_wait_file PATH [SECONDS]: waits (default 10 s) until PATH is a non-empty file.
st_wait_file() {
  local i
  for ((i = 0; i < ${2:-10} * 10; i++)); do
    [[ -s $1 ]] && return 0
    sleep 0.1
  done
  echo "timed out waiting for $1" >&2
  return 1
}

# st_wait_line FILE REGEX [SECONDS]: waits (default 60 s) until a line of FILE matches REGEX.
st_wait_line() {
  local i
  for ((i = 0; i < ${3:-60} * 10; i++)); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out waiting for /$2/ in $1" >&2
  return 1
}

# st_dht BIN NAME [INITIAL_PEER...]: starts `starling dht` on loopback (identity, log and address
# file named after NAME in $dir) and waits for its address, left in $st_addr (not printed: a
# command substitution would run it in a subshell that forgets the pid).
st_dht() {
  local bin=$1 name=$2 peer
  shift 2
  local args=(dht --identity "$dir/$name.key" --listen /ip4/127.0.0.1/tcp/0
    --addr-file "$dir/$name.addr")
  for peer in "$@"; do args+=(--initial-peers "$peer"); done
  st_bg "$dir/$name.log" "$bin" "${args[@]}"
  st_wait_file "$dir/$name.addr" || { cat "$dir/$name.log" >&2; return 1; }
  st_addr=$(head -1 "$dir/$name.addr")
}
