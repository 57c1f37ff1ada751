"""Helpers for the hang-forensics tests: where the hung programs are, and whether this
machine lets a debugger attach (tests that need it skip with the reason when it does not)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hazards.engine.forensics.debugger import attach_refusal

PROGRAMS = Path(__file__).resolve().parent / "programs"
DATA = Path(__file__).resolve().parent / "data"


def _attach_blocker() -> str | None:
    """Why this sandbox would refuse ptrace to a process we start (None: it allows it)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.05)
        return attach_refusal(p.pid)
    finally:
        p.kill()
        p.wait()


PTRACE_BLOCKED = _attach_blocker()
needs_ptrace = pytest.mark.skipif(PTRACE_BLOCKED is not None, reason=f"ptrace not permitted here: {PTRACE_BLOCKED}")
needs_gdb = pytest.mark.skipif(shutil.which("gdb") is None,
                               reason="gdb is not installed (scripts/setup.sh installs it where apt-get exists)")
needs_py_spy = pytest.mark.skipif(shutil.which("py-spy") is None,
                                  reason="py-spy is not installed (pip install 'gpu-hazards[forensics]')")


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 10.0) -> None:
    """Read the child's stdout until a line contains `text`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"{text!r} never printed")


def env_without(*names: str) -> dict[str, str]:
    """os.environ with PATH stripped of every folder holding one of `names`."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.path.exists(os.path.join(d, n)) for n in names)]
    return {**os.environ, "PATH": os.pathsep.join(keep)}
