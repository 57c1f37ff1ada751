"""The stuck thread, not the waiting one: when the main thread only waits
for another thread of its own (join, a Future, a lock a sibling holds), the host summary
names the thread that waits on something else, with its own innermost frame; every thread
stays in the raw dump."""
from __future__ import annotations

import sys
from pathlib import Path

from forensics_helpers import PROGRAMS, needs_ptrace, needs_py_spy
from hazards.engine.forensics import find_forensics_evidence
from hazards.engine.forensics.host import (Frame, HostThread, host_report, parse_gdb_backtraces,
                                           parse_py_spy_json, waits_for_sibling)
from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget

CPU_DATA = Path(__file__).resolve().parent / "data" / "cpu"
LIBPY = "libpython3.11.so.1.0"


def py(function: str, file: str, line: int) -> Frame:
    return Frame(function, file, line, python=True)


def native(function: str, library: str = "libc.so.6") -> Frame:
    return Frame(function, library=library)


def test_a_worker_stuck_while_main_joins_it_is_named_with_its_own_frame():
    """Recorded: py-spy 0.4 --native of tests/forensics/programs/hung_worker.py on the CPU machine."""
    threads = parse_py_spy_json((CPU_DATA / "hung-worker.py-spy-native.json").read_text())
    rep = host_report(10, threads, "py-spy --native")
    assert rep["sentence"].startswith("fetcher waits in fetch_forever (hung_worker.py:9)"), rep["sentence"]
    assert "MainThread waits for another thread in Thread._wait_for_tstate_lock" in rep["sentence"]
    assert rep["stuck_at"] == "hung_worker.py:9" and rep["stuck_thread"] == "fetcher"
    assert {t["name"] for t in rep["threads"]} == {"MainThread", "fetcher"}  # both stay in the dump


def test_main_waiting_on_a_lock_a_sibling_holds_names_the_sibling():
    main = HostThread(1, "MainThread", [native("__futex_abstimed_wait_common"),
                                        native("PyThread_acquire_lock_timed", LIBPY),
                                        native("lock_PyThread_acquire_lock", LIBPY),
                                        py("update_table", "/app/serve.py", 40), py("main", "/app/serve.py", 60)])
    holder = HostThread(2, "loader", [native("clock_nanosleep"), native("pysleep", LIBPY),
                                      py("load_weights", "/app/serve.py", 22),
                                      py("Thread.run", "/usr/lib/python3.11/threading.py", 982)])
    assert waits_for_sibling(main) is not None and waits_for_sibling(holder) is None
    rep = host_report(1, [main, holder], "py-spy --native")
    assert rep["stuck_at"] == "serve.py:22"
    assert rep["sentence"].startswith("loader waits in load_weights (serve.py:22)")


def test_a_main_thread_waiting_on_an_event_is_itself_the_stuck_one():
    """Event.wait takes a lock inside threading.py: that waits for anyone, not a sibling."""
    main = HostThread(1, "MainThread", [native("PyThread_acquire_lock_timed", LIBPY),
                                        py("Condition.wait", "/usr/lib/python3.11/threading.py", 320),
                                        py("Event.wait", "/usr/lib/python3.11/threading.py", 622),
                                        py("wait_for_result", "/app/hung.py", 14)])
    poller = HostThread(2, "poller", [py("background_poll", "/app/hung.py", 10)])
    rep = host_report(1, [main, poller], "py-spy --native")
    assert rep["stuck_at"] == "hung.py:14" and rep["stuck_thread"] == "MainThread"
    assert "waits for another thread" not in rep["sentence"]


def test_threads_that_all_wait_on_each_other_leave_the_main_thread_named():
    main = HostThread(1, "MainThread", [py("Thread.join", "/usr/lib/python3.11/threading.py", 1119),
                                        py("main", "/app/cycle.py", 9)])
    other = HostThread(2, "worker", [native("lock_PyThread_acquire_lock", LIBPY), py("work", "/app/cycle.py", 4)])
    rep = host_report(1, [main, other], "py-spy --native")
    assert rep["stuck_thread"] == "MainThread" and rep["stuck_at"] == "cycle.py:9"


def test_a_native_main_in_pthread_join_names_the_worker_not_a_runtime_helper():
    bt = """Thread 3 (Thread 0x7f0 (LWP 103) "cuda-EvtHandlr"):
#0  0x00007f in poll () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x00007e in ?? () from /lib/x86_64-linux-gnu/libcuda.so.1
Thread 2 (Thread 0x7f1 (LWP 102) "hung"):
#0  0x00007f in cuCtxSynchronize_v2 () from /lib/x86_64-linux-gnu/libcuda.so.1
#1  0x00007e in wait_for_device (arg=0x0) at hung.cu:31
#2  0x00007d in start_thread (arg=<optimized out>) at ./nptl/pthread_create.c:442
Thread 1 (Thread 0x7f2 (LWP 101) "hung"):
#0  __futex_abstimed_wait_common64 (private=128) at ./nptl/futex-internal.c:57
#1  0x00007f in __pthread_clockjoin_ex (threadid=1, thread_return=0x0) at ./nptl/pthread_join_common.c:105
#2  0x00007e in main () at hung.cu:44
"""
    rep = host_report(101, parse_gdb_backtraces(bt), "gdb")
    assert rep["stuck_at"] == "hung.cu:31", rep
    assert rep["sentence"] == ("hung waits in cuCtxSynchronize_v2 (libcuda.so.1) called from wait_for_device "
                               "(hung.cu:31); main thread waits for another thread in __pthread_clockjoin_ex "
                               "(./nptl/pthread_join_common.c:105) called from main (hung.cu:44)")


@needs_py_spy
@needs_ptrace
def test_a_hung_worker_under_the_watchdog_is_named_by_its_function(tmp_path, forensics_on):
    r = CommandTarget([sys.executable, str(PROGRAMS / "hung_worker.py")]).run(timeout=1.5,
                                                                              artifact_dir=tmp_path / "run")
    assert r.outcome is Outcome.HANG
    f = find_forensics_evidence(r.evidence)
    assert f["sentence"].startswith("host: fetcher waits in fetch_forever (hung_worker.py:9)"), f["sentence"]
    assert f["stuck_at"] == ["hung_worker.py:9"] and "fetch_forever" in r.reason
    raw = (tmp_path / "run" / f"hang-host-{r.evidence['pid']}.txt").read_text()
    assert "Thread.join" in raw and "fetch_forever" in raw  # all threads in the raw dump
