"""`hazards lease -- CMD`, the GPU broker, on fake GPUs: it sets CUDA_VISIBLE_DEVICES,
streams output, returns the command's status, waits for a GPU someone else holds, refuses
a card with foreign compute processes, and gives the GPU back on any exit -- including a
SIGKILL of the broker, after which nothing of the command's tree survives."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from hazards.engine.errors import UserError
from hazards.engine.leases import acquire, read_lease_log

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LEASE = [sys.executable, "-m", "hazards", "lease"]

# The command: prints its GPU and pid, starts a grandchild in a new session (as a daemon
# would), prints that pid, then sleeps. Both must die with a SIGKILLed broker.
TREE = textwrap.dedent("""
    import os, subprocess, sys, time
    print("gpu", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    print("pids", os.getpid(), g.pid, flush=True)
    time.sleep(120)
""")


def _broker(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([*LEASE, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def _finish(p: subprocess.Popen) -> tuple[str, str]:
    if p.poll() is None:
        p.kill()
    out, err = p.communicate(timeout=30)
    return out, err


def test_the_command_runs_on_the_leased_gpu_and_its_status_is_returned(fake_gpus):
    p = _broker("--", sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES']); raise SystemExit(7)")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7, err
    assert out.strip() == "0" and "leased GPU 0" in err
    events = [e["event"] for e in read_lease_log(fake_gpus)]
    assert events == ["acquire", "release"]


def test_output_is_streamed_while_the_command_runs(fake_gpus):
    p = _broker("-q", "--", sys.executable, "-c", TREE)
    try:
        assert p.stdout.readline().startswith("gpu 0")  # read while the command still sleeps
        assert p.poll() is None
    finally:
        p.send_signal(signal.SIGTERM)
        _finish(p)


def test_sigkill_of_the_broker_kills_the_command_tree_and_frees_the_gpu(fake_gpus):
    p = _broker("-q", "--", sys.executable, "-c", TREE)
    try:
        assert p.stdout.readline().startswith("gpu 0")
        _, child, grandchild = p.stdout.readline().split()
        keeper = [c.pid for c in psutil.Process(p.pid).children()]
        with pytest.raises(UserError, match="leased by"):
            acquire("0", "test")  # held while the broker lives
        p.kill()
        p.wait(timeout=30)
        assert _gone([int(child), int(grandchild), *keeper]), "the command's tree outlived its broker"
        with acquire("0", "test") as lease:  # the kernel dropped the flock with the broker
            assert lease.held
    finally:
        _finish(p)


def test_sigterm_is_forwarded_and_the_gpu_released(fake_gpus):
    p = _broker("-q", "--", sys.executable, "-c", TREE)
    try:
        p.stdout.readline()
        _, child, grandchild = p.stdout.readline().split()
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        assert p.returncode == 128 + signal.SIGTERM
        assert _gone([int(child), int(grandchild)])
        assert [e["event"] for e in read_lease_log(fake_gpus)][-1] == "release"
    finally:
        _finish(p)


def test_the_broker_waits_for_a_gpu_someone_else_holds(fake_gpus, monkeypatch):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    with acquire("0", "other-holder"):
        p = _broker("--wait", "60", "--", sys.executable, "-c", "print('ran')")
        deadline = time.monotonic() + 30
        while "waiting for a free GPU" not in (line := p.stderr.readline()):
            assert time.monotonic() < deadline and line, "no waiting message"
        assert "other-holder" in line and p.poll() is None
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and out.strip() == "ran", err


def test_no_gpu_within_wait_is_a_one_line_error(fake_gpus, monkeypatch):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    with acquire("0", "other-holder"):
        p = _broker("--wait", "1", "--", sys.executable, "-c", "print('ran')")
        out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and out == "" and "no GPU became free within 1s" in err and "Traceback" not in err


def test_bad_input_exits_2_without_leasing(fake_gpus):
    for args in ((), ("--", "no-such-program-xyz")):
        p = _broker(*args)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert read_lease_log(fake_gpus) == []


def test_a_card_with_foreign_compute_processes_is_not_leased(fake_gpus, fake_nvml, monkeypatch):
    from hazards.engine.broker import wait_for_gpu

    monkeypatch.setenv("HZ_FAKE_GPUS", "GPU-aaaa")
    fake_nvml.procs["GPU-aaaa"] = [1]  # pid 1 is never ours
    with pytest.raises(UserError, match="foreign compute processes"):
        wait_for_gpu("test", wait_s=0.5, poll_s=0.1)
    fake_nvml.procs["GPU-aaaa"] = []
    lease = wait_for_gpu("test", wait_s=0.5, poll_s=0.1)
    try:
        assert lease.uuid == "GPU-aaaa" and lease.env()["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa"
    finally:
        lease.release()
