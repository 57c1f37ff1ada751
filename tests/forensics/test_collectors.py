"""The on-hang collector end to end, on the CPU: a hung program run through the real
watchdog (CommandTarget) yields the stacks, hang.md, the run's reason and a stuck
location; a missing debugger or a denied ptrace is a one-line reason; a tiny hang budget
still ends the run on time."""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import psutil
import pytest

from forensics_helpers import PROGRAMS, env_without, needs_gdb, needs_ptrace, needs_py_spy
from hazards.engine.forensics import find_forensics_evidence
from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget

FAKES = Path(__file__).resolve().parent / "fakes"
HUNG_PY = [sys.executable, str(PROGRAMS / "hung_python.py")]


def _no_tools_left() -> None:
    """No debugger or py-spy of ours still running."""
    left = [c for c in psutil.Process().children(recursive=True)
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE
            and any(n in " ".join(c.cmdline()) for n in ("gdb", "py-spy", "wedged_gdb"))]
    assert not left, f"left running: {[c.cmdline() for c in left]}"


@needs_py_spy
@needs_ptrace
def test_a_hung_python_program_names_the_line_it_waits_on(tmp_path, forensics_on):
    r = CommandTarget(HUNG_PY).run(timeout=1.5, artifact_dir=tmp_path / "run")
    assert r.outcome is Outcome.HANG
    f = find_forensics_evidence(r.evidence)
    assert f is not None, r.evidence
    assert "called from wait_for_result (hung_python.py:14)" in f["sentence"]
    assert f["stuck_at"] == ["hung_python.py:14"]
    assert r.reason.startswith("timed out after 1.5s: ") and "hung_python.py:14" in r.reason
    md = (tmp_path / "run" / "hang.md").read_text()
    assert "wait_for_result (hung_python.py:14)" in md and "## System" in md
    raw = (tmp_path / "run" / f"hang-host-{r.evidence['pid']}.txt").read_text()
    assert "background_poll" in raw  # every thread is dumped, not only the main one
    assert f["skipped"]["device"].startswith("no process of the run holds a GPU")
    _no_tools_left()


@needs_gdb
@needs_ptrace
def test_a_hung_native_program_yields_native_stacks(tmp_path, hung_native, forensics_on):
    r = CommandTarget([str(hung_native)]).run(timeout=1.0, artifact_dir=tmp_path / "run")
    assert r.outcome is Outcome.HANG
    f = find_forensics_evidence(r.evidence)
    assert "called from wait_for_flag (hung_native.c:20)" in f["sentence"], f
    assert f["stuck_at"] == ["hung_native.c:20"]
    raw = (tmp_path / "run" / f"hang-host-{r.evidence['pid']}.txt").read_text()
    assert "sleeper" in raw and "pthread_cond_wait" in raw  # both threads' native frames
    host = f["host"][str(r.evidence["pid"])]
    assert host["tool"] == "gdb"
    _no_tools_left()


def test_no_debugger_is_a_one_line_reason_and_the_run_still_ends(tmp_path, hung_native, forensics_on,
                                                                   monkeypatch):
    monkeypatch.setenv("PATH", env_without("gdb", "cuda-gdb", "rocgdb", "py-spy")["PATH"])
    r = CommandTarget([str(hung_native)]).run(timeout=1.0, artifact_dir=tmp_path / "run")
    assert r.outcome is Outcome.HANG
    f = find_forensics_evidence(r.evidence)
    why = f["skipped"][f"host {r.evidence['pid']}"]
    assert why == "no debugger (gdb, cuda-gdb or rocgdb) on PATH: native stacks not read"
    assert f["stuck_at"] == [] and "error" not in str(f["host"])
    assert "where it hangs is unknown" in f["sentence"]
    assert f"- skipped host {r.evidence['pid']}: no debugger" in (tmp_path / "run" / "hang.md").read_text()


def test_a_py_spy_past_its_deadline_is_killed_with_what_it_started(tmp_path, stray_sleep):
    """py-spy runs as a tool in a process group of its own (proctree.run_in_group): at the
    collector's deadline the whole group is killed, not py-spy alone (a wrapper's or a helper's
    child kept running after the hang's collection)."""
    from hazards.engine.forensics.host import py_spy_dump

    fake = tmp_path / "py-spy"
    fake.write_text(f"#!/bin/sh\n{stray_sleep.command}\n")
    fake.chmod(0o755)
    try:
        got = py_spy_dump(os.getpid(), deadline=time.monotonic() + 1.0, path=str(tmp_path))
        assert got.get("error", "").startswith("py-spy did not answer within"), got
    finally:
        left = stray_sleep.left()
    assert not left, "py-spy's child outlived the collector's deadline"


def test_no_py_spy_is_a_one_line_reason(tmp_path, forensics_on, monkeypatch):
    monkeypatch.setenv("PATH", env_without("py-spy")["PATH"])
    r = CommandTarget(HUNG_PY).run(timeout=1.0, artifact_dir=tmp_path / "run")
    f = find_forensics_evidence(r.evidence)
    why = f["skipped"][f"host {r.evidence['pid']}"]
    assert why.startswith("py-spy is not installed") and "\n" not in why


@needs_gdb
@needs_ptrace
def test_a_denied_ptrace_is_a_one_line_reason(tmp_path, hung_native, forensics_on, monkeypatch):
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run gdb as another user")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "gdb").write_text(f"#!/bin/sh\nexec {setpriv} --reuid=65534 --regid=65534 --clear-groups "
                                f"--inh-caps=-all --bounding-set=-all {shutil.which('gdb')} \"$@\"\n")
    (bindir / "gdb").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    r = CommandTarget([str(hung_native)]).run(timeout=1.0, artifact_dir=tmp_path / "run")
    f = find_forensics_evidence(r.evidence)
    why = f["skipped"][f"host {r.evidence['pid']}"]
    assert why == "gdb could not attach: ptrace: Operation not permitted.", why


@needs_gdb
@needs_ptrace
def test_a_tiny_budget_still_ends_the_run_on_time(tmp_path, hung_native, forensics_on, hang_budget):
    hang_budget(0.3)
    t0 = time.monotonic()
    r = CommandTarget([str(hung_native)], grace_s=0.5).run(timeout=1.0, artifact_dir=tmp_path / "run")
    took = time.monotonic() - t0
    assert r.outcome is Outcome.HANG
    assert took < 1.0 + 0.3 + 0.5 + 2.0, took  # timeout + budget + grace, and slack for a loaded machine
    f = find_forensics_evidence(r.evidence) or {}
    # whatever it managed, it says so; the program is gone and no tool of ours is left
    assert f.get("sentence") or "still running" in str(r.evidence["collectors"])
    assert not psutil.pid_exists(r.evidence["pid"]) or psutil.Process(r.evidence["pid"]).status() == "zombie"
    _no_tools_left()


@needs_ptrace
def test_a_wedged_debugger_cannot_hold_the_run_past_its_budget(tmp_path, hung_native, forensics_on,
                                                               hang_budget, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "gdb").symlink_to(FAKES / "wedged_gdb.py")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{env_without('gdb', 'cuda-gdb', 'rocgdb')['PATH']}")
    monkeypatch.setenv("HZ_FAKE_PIDFILE", str(tmp_path / "pids"))
    hang_budget(3.0)  # enough for the (Python) fake to start on a loaded machine and attach
    t0 = time.monotonic()
    r = CommandTarget([str(hung_native)], grace_s=0.5).run(timeout=1.0, artifact_dir=tmp_path / "run")
    assert time.monotonic() - t0 < 1.0 + 3.0 + 0.5 + 1.5
    f = find_forensics_evidence(r.evidence)
    host = f["host"][str(r.evidence["pid"])]
    assert "did not finish" in host["error"]
    fake = int((tmp_path / "pids").read_text().split()[0])
    assert not psutil.pid_exists(fake) or psutil.Process(fake).status() == "zombie"
    _no_tools_left()
