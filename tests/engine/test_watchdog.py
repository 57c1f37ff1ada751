"""The watchdog's parts: collectors, output drains, descendant discovery, the verified kill."""
import gc
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from engine_fakes import FAKES, SLACK_S, assert_none_running, fake_command, recorded_pids, running
from hazards.engine.classify import NOTABLE_RE, find_fault_signature
from hazards.engine.watchdog import (Drain, HangContext, Supervised, kill_group, register_on_hang,
                             run_collectors, scan_for, unregister_on_hang)

SLEEPER = [sys.executable, str(FAKES / "sleeper.py")]


def _ctx():
    return HangContext(pid=1, pgid=1, argv=["x"], target="t", started_at=0.0,
                       artifact_dir=None, env={})


@pytest.fixture
def only_these_collectors(monkeypatch):
    """`add(fn)` registers an on-hang collector in a registry of this test's own: collectors
    the process registered before (a tripwire target installs its collector for the whole
    process) are set aside for the test, and the test's go with its registry."""
    from hazards.engine import watchdog

    monkeypatch.setattr(watchdog, "_collectors", [])
    return register_on_hang


def test_collector_errors_and_odd_outputs_are_recorded_not_raised(only_these_collectors):
    def fails(ctx):
        raise ValueError("no tripwire")

    def returns_set(ctx):
        return {"path": FAKES}  # a Path is not JSON: stored as its str

    def exits(ctx):
        raise SystemExit(3)

    for fn in (fails, returns_set, exits):
        only_these_collectors(fn)
    out = run_collectors(_ctx())
    assert out[fails.__qualname__] == {"error": "ValueError: no tripwire"}
    assert out[returns_set.__qualname__] == {"path": str(FAKES)}
    assert out[exits.__qualname__] == {"error": "SystemExit: 3"}


def test_registering_twice_calls_once_and_unregister_is_forgiving(only_these_collectors):
    calls = []
    only_these_collectors(calls.append)
    register_on_hang(calls.append)
    run_collectors(_ctx())
    assert len(calls) == 1
    unregister_on_hang(calls.append)
    unregister_on_hang(calls.append)  # not registered any more: no error
    run_collectors(_ctx())
    assert len(calls) == 1


def test_a_blocking_collector_cannot_stall_the_supervisor(only_these_collectors):
    def blocks(ctx):
        time.sleep(30)

    only_these_collectors(blocks)
    t0 = time.monotonic()
    out = run_collectors(_ctx(), budget_s=0.2)
    assert time.monotonic() - t0 < SLACK_S
    assert list(out) == [blocks.__qualname__], out
    assert "still running" in out[blocks.__qualname__]["error"]


def _drain_bytes(data: bytes, **kw) -> Drain:
    r, w = os.pipe()
    drain = Drain(r, name="t", **kw)
    drain.start()
    os.write(w, data) if len(data) < 60000 else _write_all(w, data)
    os.close(w)
    drain.join(5)
    os.close(r)
    return drain


def _write_all(fd, data):
    with os.fdopen(os.dup(fd), "wb") as f:
        f.write(data)


def test_drain_keeps_a_bounded_tail_and_notable_lines_that_scrolled_out():
    body = b"CUDA error: misaligned address\n" + b"".join(
        b"line %d\n" % i for i in range(50000)) + b"last line without newline"
    drain = _drain_bytes(body, tail_bytes=1024, notable_re=NOTABLE_RE)
    assert drain.total == len(body)
    assert len(drain.tail()) == 1024 and drain.tail().endswith(b"last line without newline")
    assert drain.text().startswith("CUDA error: misaligned address\n")


def test_drain_keeps_each_kind_of_notable_line_despite_a_flood_of_another():
    body = (b'KERNEL_RESULT {"i": 0}\n' * 5000 + b"CUDA error: misaligned address\n"
            + b'KERNEL_RESULT {"i": 1}\n' * 5000)
    drain = _drain_bytes(body, tail_bytes=1024, notable_re=NOTABLE_RE)
    assert "misaligned address" not in drain.tail().decode()
    assert find_fault_signature(drain.text())[0] == "misaligned_address"


def test_drain_writes_the_full_log(tmp_path):
    body = b"".join(b"row %d\n" % i for i in range(30000))
    _drain_bytes(body, tail_bytes=100, log_path=tmp_path / "out.log")
    assert (tmp_path / "out.log").read_bytes() == body


def test_scan_finds_a_marked_process_in_another_session():
    mark = b"HZ_SUPERVISED_testmark="
    env = dict(os.environ, HZ_SUPERVISED_testmark="1")
    proc = subprocess.Popen(SLEEPER, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while proc.pid not in scan_for(-1, mark) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.pid in scan_for(-1, mark)
        assert proc.pid in scan_for(proc.pid)  # and by its process group
        assert proc.pid not in scan_for(-1, b"HZ_SUPERVISED_other=")
    finally:
        proc.kill()
        proc.wait()


def test_kill_group_escalates_to_sigkill_and_verifies_no_survivor():
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            f" p = subprocess.Popen({SLEEPER!r}); print(p.pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            start_new_session=True)
    child_pid = int(proc.stdout.readline())
    t0 = time.monotonic()
    evidence = kill_group(proc.pid, grace_s=0.3, leader=proc)
    assert time.monotonic() - t0 < 0.3 + SLACK_S
    assert set(evidence["killed"]) == {proc.pid, child_pid}
    # The sleeper inherited SIG_IGN for SIGTERM across exec, so both needed SIGKILL.
    assert evidence["sigkill"] == sorted({proc.pid, child_pid})
    assert evidence["survivors"] == []
    assert proc.returncode == -signal.SIGKILL
    assert_none_running({proc.pid, child_pid})


def test_supervised_exit_status_does_not_reap_before_the_group_is_killed():
    child = Supervised([sys.executable, "-c", "import sys; sys.exit(5)"], env=dict(os.environ))
    assert child.wait_exit(time.monotonic() + 10)
    assert child.exit_status() == 5
    assert os.path.exists(f"/proc/{child.pid}")  # still a zombie: its group id stays ours
    evidence = child.kill()
    assert evidence["survivors"] == [] and child.proc.returncode == 5
    assert not os.path.exists(f"/proc/{child.pid}")
    assert child.kill() == evidence  # idempotent


def test_supervised_wait_times_out_on_a_live_child_and_kill_ends_it():
    child = Supervised(SLEEPER, env=dict(os.environ), grace_s=0.5)
    t0 = time.monotonic()
    assert not child.wait_exit(t0 + 0.3)
    assert 0.3 <= time.monotonic() - t0 < 0.3 + SLACK_S
    assert running(child.pid)
    assert child.kill()["survivors"] == []
    assert not running(child.pid)


def test_a_forgotten_child_is_killed_when_its_supervised_object_is_collected():
    child = Supervised(SLEEPER, env=dict(os.environ))
    pid = child.pid
    assert running(pid)
    del child
    gc.collect()
    assert not running(pid)


def _escaped_grandchild(mode, tmp_path):
    """Start the fake in `mode`, wait until its grandchild has left the group and been
    reparented, without ever sampling descendants; return (child, grandchild pid)."""
    pidfile = tmp_path / "pids"
    child = Supervised(fake_command(mode), env=dict(os.environ, HZ_FAKE_PIDFILE=str(pidfile)),
                       grace_s=0.5)
    deadline = time.monotonic() + 10
    while b"ready" not in child.stdout_drain.tail() and time.monotonic() < deadline:
        time.sleep(0.01)
    pids = recorded_pids(pidfile)
    assert len(pids) == 3, pids
    # Its parent has exited (reaped by the program), so only the program and it run.
    (grandchild,) = [p for p in pids if running(p) and p != child.pid]
    assert psutil.Process(grandchild).ppid() not in pids
    assert os.getpgid(grandchild) != child.pgid
    return child, grandchild, pids


def test_escaped_grandchild_with_the_marker_is_killed_without_any_sample(tmp_path, without_cgroups):
    child, grandchild, pids = _escaped_grandchild("setsid_grandchild", tmp_path)
    evidence = child.kill()
    assert grandchild in evidence["killed"] and "pipe_holders" not in evidence
    assert evidence["survivors"] == []
    assert_none_running(pids)


def test_escaped_grandchild_without_marker_is_found_by_the_pipe_it_holds(tmp_path, without_cgroups):
    child, grandchild, pids = _escaped_grandchild("setsid_grandchild_pipe", tmp_path)
    evidence = child.kill()
    assert evidence["pipe_holders"] == [grandchild] and grandchild in evidence["killed"]
    assert evidence["survivors"] == []
    assert_none_running(pids)


def test_the_supervisor_never_imports_a_gpu_library():
    code = ("import sys, hazards.engine.targets, hazards.engine.watchdog, hazards.engine.classify, hazards.engine.protocol; "
            "bad = [m for m in ('torch', 'cupy', 'pycuda', 'cuda', 'triton', 'jax', "
            "'tensorflow', 'numba', 'pynvml') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=FAKES.parent.parent, check=True)
    assert out.stdout.strip() == "[]"
