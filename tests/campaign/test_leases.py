"""GPU leases: exclusive across processes, released by the OS when the holder dies, and
honouring CUDA_VISIBLE_DEVICES."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hazards.engine.errors import UserError
from hazards.engine.leases import (LeaseUnavailable, acquire, acquire_free, current_holders, lease_candidates,
                           read_lease_log)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOLDER = textwrap.dedent("""
    import sys, time
    from hazards.engine.leases import acquire
    lease = acquire(sys.argv[1], "child-holder")
    print("held", flush=True)
    time.sleep(120)
""")

TRY = textwrap.dedent("""
    import sys
    from hazards.engine.leases import acquire, LeaseUnavailable
    try:
        acquire(sys.argv[1], "second")
    except LeaseUnavailable as e:
        print("refused:", e)
        sys.exit(3)
    print("acquired")
""")


def _py(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
    child.wait()
    child.stdout.close()
    child.stderr.close()


def test_two_processes_cannot_hold_one_lease(fake_gpus):
    with acquire("0", "test-holder") as lease:
        assert lease.held
        p = _py(TRY, "0")
        out, err = p.communicate(timeout=30)
        assert p.returncode == 3, (out, err)
        assert f"pid {os.getpid()}" in out and "test-holder" in out
        # a different GPU is free for the other process
        p = _py(TRY, "1")
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0 and "acquired" in out, (out, err)
    p = _py(TRY, "0")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "acquired" in out, (out, err)


def test_a_child_given_its_parents_lease_runs_under_it_and_nobody_else_does(fake_gpus):
    inherit = textwrap.dedent("""
        import sys
        from hazards.engine.leases import acquire, LeaseUnavailable
        try:
            lease = acquire(sys.argv[1], "second")
        except LeaseUnavailable:
            sys.exit(3)
        print("acquired", lease.held, lease.inherited_from)
    """)
    with acquire("0", "campaign") as lease:
        child = _py(inherit, "0", env={**os.environ, **lease.env()})
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0 and out.split() == ["acquired", "False", str(os.getpid())], (out, err)
        # a stale or foreign token is not the holder's: refused
        other = _py(inherit, "0", env={**os.environ, "HZ_LEASED": lease.lock_path.name + ":1"})
        assert other.wait(30) == 3
        other.stdout.close(), other.stderr.close()
        assert lease.held  # the child's inherited lease released nothing
    assert [e["event"] for e in read_lease_log() if e.get("holder") == "second"][:2] == ["inherit", "refused"]


def test_a_second_lease_in_the_same_process_is_refused(fake_gpus):
    with acquire("1", "first"):
        with pytest.raises(LeaseUnavailable, match="first"):
            acquire("1", "second")


def test_sigkilled_holder_releases_its_lease(fake_gpus):
    child = _py(HOLDER, "0")
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(LeaseUnavailable, match="child-holder"):
            acquire("0", "parent")
        assert any(h.get("pid") == child.pid for h in current_holders().values())
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        _stop(child)
    with acquire("0", "parent") as lease:
        assert lease.held
    events = read_lease_log()
    reclaim = [e for e in events if e["event"] == "reclaim"]
    assert reclaim and reclaim[-1]["previous"]["pid"] == child.pid


def test_waiting_acquire_gets_the_gpu_once_it_is_released(fake_gpus):
    child = _py(HOLDER, "1")
    try:
        assert child.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        killer = subprocess.Popen([sys.executable, "-c", f"import os,time,signal; time.sleep(1); os.kill({child.pid}, signal.SIGKILL)"])
        with acquire("1", "waiter", wait_s=20) as lease:
            assert lease.held and time.monotonic() - t0 >= 0.9
        killer.wait(timeout=30)
    finally:
        _stop(child)


def test_lease_log_records_who_held_what_and_when(fake_gpus):
    t0 = time.time()
    with acquire("0", "soak-night"):
        pass
    events = [e for e in read_lease_log() if e["gpu"] == "0"]
    kinds = [e["event"] for e in events]
    assert kinds[-2:] == ["acquire", "release"]
    acq, rel = events[-2:]
    for e in (acq, rel):
        assert e["pid"] == os.getpid() and e["holder"] == "soak-night" and e["host"]
        assert t0 - 1 <= e["t"] <= time.time() + 1
    assert rel["held_s"] >= 0


@pytest.mark.parametrize("cvd, expected", [
    (None, ["0", "1", "2", "3"]),
    ("2,3", ["2", "3"]),
    ("3", ["3"]),
    ("", []),
    ("1,7,2", ["1"]),  # CUDA stops at the first entry that is not a device
])
def test_cuda_visible_devices_is_honoured(monkeypatch, tmp_path, cvd, expected):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0,1,2,3")
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path))
    if cvd is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    assert [g for g, _ in lease_candidates()] == expected
    leases, skipped = acquire_free("test")
    try:
        assert [lease.gpu for lease in leases] == expected and not skipped
        for lease in leases:
            assert lease.env()["CUDA_VISIBLE_DEVICES"] == lease.gpu
    finally:
        for lease in leases:
            lease.release()


def test_acquire_free_skips_gpus_leased_by_others(fake_gpus):
    with acquire("0", "someone-else"):
        leases, skipped = acquire_free("me")
        try:
            assert [lease.gpu for lease in leases] == ["1"]
            assert "someone-else" in skipped["0"]
        finally:
            for lease in leases:
                lease.release()


def test_exclusive_check_refuses_a_gpu_with_foreign_compute_processes(fake_gpus, fake_nvml):
    fake_nvml.procs["GPU-bbbb"] = [999999]
    with acquire("0", "me", uuid="GPU-aaaa", exclusive=True) as lease:
        assert lease.held
    with pytest.raises(LeaseUnavailable, match="foreign compute processes"):
        acquire("1", "me", uuid="GPU-bbbb", exclusive=True)
    # the refused lease left nothing behind: without the check it is free
    with acquire("1", "me", uuid="GPU-bbbb") as lease:
        assert lease.held and lease.env()["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"
    assert not [e for e in read_lease_log() if e["event"] == "reclaim"]


def test_unusable_lease_folder_is_a_one_line_user_error(fake_gpus, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="cannot create lease folder"):
        acquire("0", "me", lock_dir=blocker / "sub")


def test_a_lease_that_fails_to_be_recorded_is_released_and_a_user_error(fake_gpus, monkeypatch):
    import hazards.engine.leases as leases

    real_log = leases._log

    def full_disk(lock_dir, event, **fields):
        if event == "acquire":
            raise OSError(28, "No space left on device")
        real_log(lock_dir, event, **fields)

    monkeypatch.setattr(leases, "_log", full_disk)
    with pytest.raises(UserError, match="No space left on device") as failed:
        acquire("0", "doomed")
    monkeypatch.setattr(leases, "_log", real_log)
    # The traceback (which keeps the failed acquire's frame alive) is still held here: the
    # lease must have been dropped explicitly, not by garbage collection.
    assert failed.value is not None
    p = _py(TRY, "0")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "acquired" in out, (out, err)
