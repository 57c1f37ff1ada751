#!/bin/sh
# A fake target for bench/reliability_cpu.py: `reliability_fake.sh MODE PIDFILE STARTLOG`.
# Every process it leaves running appends its pid to PIDFILE, and every sleep it starts is
# `sleep 86399` (so the bench can prove none survives, by pid and by a scan of all
# processes); every invocation appends one line to STARTLOG (runs started). sh and awk
# only: a run costs a few milliseconds, so 2,000 of them fit in minutes on two busy cores.
mode=$1 pids=$2 started=$3
echo "$mode" >>"$started"
echo $$ >>"$pids"

bar() {  # a tqdm-style progress bar: carriage returns, no newline, $1 printed past column 1,000
  awk -v what="$1" 'BEGIN {
    for (i = 0; i < 300; i++) printf "\r%3d%%|%-10s| %d/300 [00:01<00:02, 99.9it/s]", i / 3, substr("##########", 1, i / 30), i
    printf "\r%s", what
    for (i = 0; i < 300; i++) printf "\r%3d%%|%-10s| %d/300 [00:01<00:02, 99.9it/s]", i / 3, substr("##########", 1, i / 30), i
    printf "\n"
    for (i = 0; i < 3000; i++) printf "epoch %d loss 0.%04d\n", i, i }' >&2
}

case $mode in
  # ran to completion
  clean) echo 'computing...'; echo 'HZ_RESULT {"ok": true, "mismatched": 0}' ;;
  mismatch_line) echo 'HZ_RESULT {"ok": false, "mismatched": 2, "max_rel_err": 0.5}' ;;
  exit1) echo 'wrong answer' >&2; exit 1 ;;
  # device faults
  fault_exit3) exit 3 ;;
  fault_msg) echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2 ;;
  segv) kill -SEGV $$ ;;
  longline_fault) bar 'RuntimeError: CUDA error: an illegal memory access was encountered' ;;
  longline_result) bar 'HZ_RESULT {"ok": false, "mismatched": 1}'; exit 0 ;;
  # result lines nobody can read: error, never clean
  malformed_json) echo 'HZ_RESULT {"ok": false, max_err: 3}' ;;
  malformed_ok) echo 'HZ_RESULT {"ok":"false"}' ;;
  malformed_count) echo 'HZ_RESULT {"mismatched":"3"}' ;;
  malformed_status) echo 'HZ_RESULT {"status":"done"}' ;;
  # a malformed line beside a failure signal: a counted mismatch, never an error
  malformed_says_mismatch) echo 'KERNEL_RESULT {"status": "mismatch", "max_err": 0.4}' ;;
  malformed_exit1) echo 'HZ_RESULT {"ok": false, max_err: 3}'; exit 1 ;;
  # a wrapper script reporting its child's death by signal N as 128+N
  wrapper_sigkill) sh -c 'kill -KILL $$'; exit $? ;;
  wrapper_segv) sh -c 'kill -SEGV $$'; exit $? ;;
  # hangs
  hang_sleep) exec sleep 86399 ;;
  hang_ignore_term) trap '' TERM; sleep 86399 & echo $! >>"$pids"; wait ;;
  hang_setsid)  # a grandchild in a session of its own, keeping our output pipes
    setsid sleep 86399 & echo $! >>"$pids"; exec sleep 86399 ;;
  hang_daemon)  # fork, setsid, fork; no marker, no pipes of ours: only a cgroup finds it
    ( setsid sh -c 'echo $$ >>"$0"; exec env -i sleep 86399 </dev/null >/dev/null 2>&1' "$pids" & )
    exec sleep 86399 ;;
  # a supervisor-kill workload: each invocation one of clean / hang kinds, in turn
  cycle)
    n=$(wc -l <"$started")
    case $((n % 4)) in
      0) echo 'HZ_RESULT {"ok": true}' ;;
      1) exec "$0" hang_setsid "$pids" /dev/null ;;
      2) exec "$0" hang_daemon "$pids" /dev/null ;;
      3) exec "$0" hang_ignore_term "$pids" /dev/null ;;
    esac ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
