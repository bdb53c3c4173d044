# Shared helpers for the netlab tests (sourced). Paths come from ctest's environment
# (tests/netlab/CMakeLists.txt) or default to the source tree and ./build/bin.
set -euo pipefail
export LC_ALL=C

T_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NETLAB=${NETLAB:-$T_SRC/tools/netlab/netlab}
CHAOS=${CHAOS:-$T_SRC/tools/netlab/chaos}
DELAY_PROXY=${DELAY_PROXY:-$T_SRC/build/bin/starling-delay-proxy}
NETPROBE=${NETPROBE:-$T_SRC/build/bin/starling-netprobe}
export NETLAB_DELAY_PROXY=${NETLAB_DELAY_PROXY:-$DELAY_PROXY}
export NETLAB_QUIET=1

T_NAME=$(basename "$0" .sh)
T_FAILS=0
T_RUN=""  # netlab run to tear down at exit
T_PIDS=() # background processes to kill at exit
T_TMP=$(mktemp -d "/tmp/netlab-test-$T_NAME.XXXXXX")

t_cleanup() {
  local rc=$?
  set +e
  for p in "${T_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  [[ -n $T_RUN ]] && "$NETLAB" --name "$T_RUN" down >/dev/null 2>&1
  for p in "${T_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  if [[ $rc -eq 0 || $rc -eq 77 ]]; then rm -rf "$T_TMP"; else echo "# kept $T_TMP" >&2; fi
  exit $rc
}
trap t_cleanup EXIT

skip() {
  echo "SKIP $T_NAME: $*"
  exit 77
}
note() { echo "# $*"; }
pass() { echo "ok   - $*"; }
fail() {
  echo "FAIL - $*"
  T_FAILS=$((T_FAILS + 1))
}
check() {  # description command...
  local d=$1
  shift
  if "$@"; then pass "$d"; else fail "$d"; fi
}
finish() {
  if ((T_FAILS > 0)); then
    echo "$T_NAME: $T_FAILS check(s) failed"
    exit 1
  fi
  echo "$T_NAME: all checks passed"
  exit 0
}

need_root() {  # skips unless netlab can run here
  local rc=0
  "$NETLAB" check "$@" >/dev/null 2>"$T_TMP/check.err" || rc=$?
  if ((rc == 77)); then skip "$(cat "$T_TMP/check.err")"; fi
  ((rc == 0)) || { cat "$T_TMP/check.err"; exit 1; }
}
need_cmd() {
  local c
  for c in "$@"; do command -v "$c" >/dev/null || skip "'$c' is not installed"; done
}
need_bins() {
  local b
  for b in "$@"; do
    [[ -x $b ]] || { echo "FAIL - missing binary $b (build the netlab tools first)"; exit 1; }
  done
}

# between VALUE LO HI: true if LO <= VALUE <= HI (decimals allowed)
between() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN{exit !(v >= lo && v <= hi)}'; }

# field KEY LINE: value of KEY=value in a "k=v k=v" line
field() { sed -nE "s/.*(^| )$1=([^ ]*).*/\\2/p" <<<"$2"; }

# wait_for_line FILE REGEX [SECONDS]: waits until FILE has a line matching REGEX
wait_for_line() {
  local f=$1 re=$2 secs=${3:-10} i
  for ((i = 0; i < secs * 20; i++)); do
    grep -qE "$re" "$f" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "# timed out waiting for /$re/ in $f:" >&2
  cat "$f" >&2 || true
  return 1
}

# listen_port FILE: port from a "listening ADDR:PORT" line
listen_port() { sed -nE 's/^listening .*:([0-9]+)$/\1/p' "$1" | head -1; }

# up ARGS...: starts a netlab run (torn down at exit); sets T_RUN
up() {
  T_RUN=$("$NETLAB" up "$@")
  note "netlab run $T_RUN: $*"
}
nl() { "$NETLAB" --name "$T_RUN" "$@"; }

# bg_on HOST LOGFILE CMD...: runs CMD on HOST in the background, remembering its pid
bg_on() {
  local h=$1 logf=$2
  shift 2
  "$NETLAB" --name "$T_RUN" exec "$h" -- "$@" >"$logf" 2>&1 </dev/null &
  T_PIDS+=("$!")
}

# wait_listen HOST PORT [SECONDS]: waits until a TCP socket listens on PORT inside HOST
wait_listen() {
  local h=$1 port=$2 secs=${3:-10} i
  for ((i = 0; i < secs * 10; i++)); do
    "$NETLAB" --name "$T_RUN" exec "$h" -- ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && return 0
    sleep 0.1
  done
  echo "# timed out waiting for a listener on $h:$port" >&2
  return 1
}

# starling_node NAME HOST ARGS...: `$STARLING node` on HOST in the background with its own
# identity ($T_TMP/NAME.key), logging at info to $T_TMP/NAME.log; its pid in NODE_PID[NAME]
declare -A NODE_PID=()
starling_node() {
  local name=$1 host=$2
  shift 2
  bg_on "$host" "$T_TMP/$name.log" env HOME="$T_TMP" "$STARLING" --log info node \
    -i "$T_TMP/$name.key" "$@"
  NODE_PID[$name]=$!
}
# node_peer_id NAME: the peer id a starling_node printed
node_peer_id() { sed -nE 's/^peer id (.*)$/\1/p' "$T_TMP/$1.log" | head -1; }

# run_chaos CONFIG WHAT KILLED_CHECK AGREE_CHECK: runs tools/netlab/chaos with CONFIG (its
# check script writes "agreed" to check.log when the peers agree) and checks that it passed,
# killed and restarted peers, the peers agreed, and the netlab run was torn down.
run_chaos() {
  local conf=$1 what=$2 killed=$3 agree=$4 rc=0 name
  "$CHAOS" --config "$conf" --out "$T_TMP/run" >"$T_TMP/run.out" 2>&1 || rc=$?
  ((rc == 77)) && skip "chaos could not start netlab"
  head -3 "$T_TMP/run/summary.txt"
  cat "$T_TMP/run/check.log" 2>/dev/null
  check "$what under chaos passes (exit $rc)" test "$rc" -eq 0
  check "$killed" grep -qP '\tkilled$' "$T_TMP/run/results.tsv"
  check "$agree" grep -q agreed "$T_TMP/run/check.log"
  name=$(sed -nE 's/^run ([a-z0-9]+):.*/\1/p' "$T_TMP/run/netlab-status.txt")
  check "chaos tore down its netlab run ($name)" \
    bash -c "[[ -n '$name' ]] && ! ip netns list | grep -q '^$name-'"
}
