#!/usr/bin/env bash
# The chaos runner with stand-in commands on this machine (--local, no root needed): a
# well-behaved collaboration passes while peers are killed and restarted on the seeded
# schedule; the schedule depends only on the seed; a peer that kills itself with SIGSEGV, one
# that prints a sanitizer report, one that ignores SIGTERM (hung) and a failing agreement check
# each make the run fail with the right verdict; nothing is left running afterwards.
source "$(dirname "$0")/lib.sh"
export CHAOS_QUIET=1
mark="chaosmark$$"

cat >"$T_TMP/base.conf" <<CONF
# stand-ins: the bootstrap sleeps, peers write heartbeats
hosts = 4
peers = 4
duration_s = 4
seed = 11
kill_every_s = 0.8
restart_after_s = 0.3
max_dead = 2
term_grace_s = 2
bootstrap_cmd = exec -a $mark-boot sleep 1000
peer_cmd = echo "peer {i} run {run} seed {seed} port {port} boot {bootstrap_addr}:{bootstrap_port}"; exec -a $mark-p{i} sleep 1000
check_cmd = test -s logs/p1.1.log && grep -q 'peer 1 run 1' logs/p1.1.log
CONF

leftovers() { ps -eo args | grep -c "^$mark" || true; }
run_chaos() {  # OUTDIR ARGS... -> exit status in RC
  RC=0
  "$CHAOS" --config "$T_TMP/base.conf" --local --out "$T_TMP/$1" "${@:2}" >"$T_TMP/$1.out" 2>&1 || RC=$?
}
verdict() { grep -E "^$2[[:space:]]" "$T_TMP/$1/results.tsv" | awk -F'\t' '{print $7}'; }

# 1. Well-behaved: passes, with kills and restarts.
run_chaos good
check "well-behaved run passes (exit $RC)" test "$RC" -eq 0
check "summary says PASS" grep -q 'verdict: PASS' "$T_TMP/good/summary.txt"
kills=$(grep -cE '^[0-9.]+ kill p' "$T_TMP/good/events.log" || true)
check "peers were killed ($kills kills)" test "$kills" -ge 2
restarts=$(cd "$T_TMP/good/logs" && printf '%s\n' *.log | grep -c '^p[1-9]*\.[2-9]\.log$' || true)
check "killed peers were restarted ($restarts restarts)" test "$restarts" -ge 1
check "killed runs are recorded as killed (SIGKILL)" \
  bash -c "grep -P '\tsignal KILL\tkilled$' '$T_TMP/good/results.tsv' | grep -q ."
check "placeholders were filled" grep -q 'peer 2 run 1 seed [0-9]* port 20002 boot 127.0.0.1:20000' "$T_TMP/good/logs/p2.1.log"
check "the bootstrap was never killed" test "$(cd "$T_TMP/good/logs" && printf '%s\n' p0.*.log | wc -l)" -eq 1
check "nothing left running" test "$(leftovers)" -eq 0

# 2. The schedule is a function of the seed.
run_chaos again
check "same seed again gives the identical schedule" diff "$T_TMP/good/schedule.txt" "$T_TMP/again/schedule.txt"
run_chaos other --set seed=12
check "another seed gives another schedule" bash -c "! diff -q '$T_TMP/good/schedule.txt' '$T_TMP/other/schedule.txt' >/dev/null"

# 3. A peer that crashes with SIGSEGV.
run_chaos segv --set 'peer_cmd=if [ {i} = 2 ]; then sleep 0.5; kill -SEGV $$; fi; exec -a '"$mark"'-p{i} sleep 1000' --set kill_every_s=0
check "crashing peer fails the run (exit $RC)" test "$RC" -eq 1
check "p2.1 verdict is CRASH" test "$(verdict segv p2.1)" = CRASH
check "its status is signal SEGV" grep -qP '^p2\.1\t.*\t139\tsignal SEGV\t' "$T_TMP/segv/results.tsv"
check "other peers are fine" test "$(verdict segv p1.1)" = ok
check "summary says FAIL" grep -q 'verdict: FAIL' "$T_TMP/segv/summary.txt"

# 4. A sanitizer report in a log counts as a crash even with a clean exit status.
run_chaos asan --set 'peer_cmd=if [ {i} = 3 ]; then echo "==1==ERROR: AddressSanitizer: heap-use-after-free"; fi; exec -a '"$mark"'-p{i} sleep 1000' --set kill_every_s=0 --set duration_s=1
check "sanitizer report fails the run" test "$RC" -eq 1
check "p3.1 verdict is CRASH" test "$(verdict asan p3.1)" = CRASH

# 5. A peer that ignores SIGTERM is reported hung and killed.
run_chaos hung --set 'peer_cmd=if [ {i} = 1 ]; then trap "" TERM; fi; exec -a '"$mark"'-p{i} sleep 1000' --set kill_every_s=0 --set duration_s=1 --set term_grace_s=1
check "hung peer fails the run" test "$RC" -eq 1
check "p1.1 verdict is HUNG" test "$(verdict hung p1.1)" = HUNG
check "p2.1 stopped in time" test "$(verdict hung p2.1)" = ok
check "the hung process was killed afterwards" test "$(leftovers)" -eq 0

# 6. The agreement check decides.
run_chaos disagree --set 'check_cmd=echo "peers disagree"; exit 3' --set duration_s=1
check "failing agreement check fails the run" test "$RC" -eq 1
check "check status recorded" grep -q 'check: 3' "$T_TMP/disagree/summary.txt"
check "check output kept" grep -q 'peers disagree' "$T_TMP/disagree/check.log"

# 7. Bad configuration is a usage error.
RC=0
"$CHAOS" --local --set hosts=2 >/dev/null 2>&1 || RC=$?
check "missing commands -> exit 2" test "$RC" -eq 2
RC=0
"$CHAOS" --config "$T_TMP/base.conf" --set nonsense=1 >/dev/null 2>&1 || RC=$?
check "unknown key -> exit 2" test "$RC" -eq 2
check "nothing left running at the end" test "$(leftovers)" -eq 0
finish
