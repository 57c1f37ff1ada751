"""Helpers for the engine tests: the fake targets, their pid files, and liveness checks."""
import sys
from pathlib import Path

import psutil

FAKES = Path(__file__).resolve().parent.parent / "fakes"
# What a bound on a run's elapsed time allows beyond the time it asserts, on a loaded CI box
# (two xdist workers on two cores). The fakes that must not be waited for sleep 30 s and more.
SLACK_S = 5.0


def fake_command(mode: str, *args: str) -> list[str]:
    """argv of the fake command target in `mode` (tests/fakes/fake_command.py)."""
    return [sys.executable, str(FAKES / "fake_command.py"), mode, *args]


def fake_server(*args: str) -> list[str]:
    """argv of the fake server target (tests/fakes/fake_server.py)."""
    return [sys.executable, str(FAKES / "fake_server.py"), *args]


def recorded_pids(pidfile: Path) -> set[int]:
    """Every pid the fakes recorded (each of their processes writes its own)."""
    if not pidfile.exists():
        return set()
    return {int(line) for line in pidfile.read_text().split()}


def running(pid: int) -> bool:
    """True if `pid` is a live process; a zombie (dead, awaiting reaping) is not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_none_running(pids: set[int]) -> None:
    alive = sorted(p for p in pids if running(p))
    assert not alive, f"processes survived: {alive}"
