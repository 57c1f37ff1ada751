"""The debugger session: it never leaves a process stopped or attached, it keeps to its
deadline, and it says in one line why it could not attach."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forensics_helpers import needs_gdb, needs_ptrace
from hazards.engine.forensics.debugger import (AttachRefused, DebuggerGone, DebuggerSession, attach_refusal,
                                               find_debugger, resume_if_stopped, stopped_tasks, tracer_of)
from hazards.engine.proctree import ToolGroups

FAKES = Path(__file__).resolve().parent / "fakes"


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    time.sleep(0.1)
    yield p
    p.kill()
    p.wait()


@needs_ptrace
def test_a_wedged_debugger_is_killed_at_the_deadline_and_its_tracee_resumed(sleeper, tmp_path):
    t0 = time.monotonic()  # generous deadline: the fake is a Python program, slow to start on a loaded machine
    s = DebuggerSession(str(FAKES / "wedged_gdb.py"), deadline=t0 + 4.0, detach_reserve_s=0.5)
    with pytest.raises(DebuggerGone, match="did not finish"):
        s.attach(sleeper.pid)
    assert tracer_of(sleeper.pid) == s.proc.pid  # the fake really attached and stopped it
    s.close()
    assert time.monotonic() - t0 < 4.0 + 1.0
    assert s.proc.poll() is not None
    assert tracer_of(sleeper.pid) == 0
    assert stopped_tasks(sleeper.pid) == []
    # whether the kernel leaves the dead tracer's tracee in a stop is a race (the attach's
    # SIGSTOP may not have been delivered yet); when it did, the session says it resumed it
    assert all("SIGCONT" in n for n in s.notes)


def test_a_process_left_stopped_without_a_tracer_is_resumed(sleeper):
    os.kill(sleeper.pid, signal.SIGSTOP)
    t_end = time.monotonic() + 5
    while not stopped_tasks(sleeper.pid) and time.monotonic() < t_end:
        time.sleep(0.01)
    assert stopped_tasks(sleeper.pid)
    note = resume_if_stopped(sleeper.pid)
    assert note == f"process {sleeper.pid} was left stopped after the debugger ended: sent SIGCONT"
    t_end = time.monotonic() + 5
    while stopped_tasks(sleeper.pid) and time.monotonic() < t_end:
        time.sleep(0.01)
    assert stopped_tasks(sleeper.pid) == [] and resume_if_stopped(sleeper.pid) is None


@needs_gdb
@needs_ptrace
def test_gdb_detaches_and_leaves_the_process_running(sleeper):
    with DebuggerSession(shutil.which("gdb"), deadline=time.monotonic() + 20) as s:
        s.attach(sleeper.pid)
        assert tracer_of(sleeper.pid) == s.proc.pid
        out = s.run("thread apply all bt")
        assert "#0" in out.text and out.complete
    assert tracer_of(sleeper.pid) == 0 and stopped_tasks(sleeper.pid) == []
    assert [o.command for o in s.transcript][:2] == [f"attach {sleeper.pid}", "thread apply all bt"]


def test_an_ended_session_leaves_no_debugger_in_its_phases_tool_groups():
    """The debugger is registered in every ToolGroups scope it starts within (so ending the
    phase ends it); once the session ends, none of them keeps it."""
    phase, inner = ToolGroups(), None
    with phase.current():
        inner = ToolGroups()
        with inner.current():
            s = DebuggerSession(str(FAKES / "wedged_gdb.py"), deadline=time.monotonic() + 10)
            assert phase._procs == inner._procs == {s.proc}
            s.close()
    assert s.proc.poll() is not None
    assert phase._procs == inner._procs == set()


def test_a_debugger_that_never_answers_leaves_no_tool_in_its_phases_tool_groups():
    """A debugger gone before its setup commands (DebuggerGone) is closed by the session too."""
    phase = ToolGroups()
    with phase.current():
        with pytest.raises(DebuggerGone):
            DebuggerSession(shutil.which("true"), deadline=time.monotonic() + 10)
    assert phase._procs == set()


def _scope(tmp_path: Path, value: str) -> Path:
    f = tmp_path / "ptrace_scope"
    f.write_text(value + "\n")
    return f


def test_yama_scope_3_is_a_one_line_refusal(sleeper, tmp_path):
    why = attach_refusal(sleeper.pid, scope_file=_scope(tmp_path, "3"))
    assert why is not None and "disabled" in why and "\n" not in why


def test_yama_scope_1_without_cap_sys_ptrace_is_refused(sleeper, tmp_path, monkeypatch):
    from hazards.engine.forensics import debugger

    monkeypatch.setattr(debugger, "has_cap_sys_ptrace", lambda pid="self": False)
    why = attach_refusal(sleeper.pid, scope_file=_scope(tmp_path, "1"))
    assert why is not None and "CAP_SYS_PTRACE" in why and "\n" not in why
    monkeypatch.setattr(debugger, "has_cap_sys_ptrace", lambda pid="self": True)
    assert attach_refusal(sleeper.pid, scope_file=_scope(tmp_path, "1")) is None


def test_a_gone_process_is_a_refusal_not_an_error(tmp_path):
    p = subprocess.Popen(["true"])
    p.wait()
    assert attach_refusal(p.pid) == f"process {p.pid} is gone"


@needs_ptrace
def test_an_already_traced_process_is_refused_with_its_tracer(sleeper):
    s = DebuggerSession(str(FAKES / "wedged_gdb.py"), deadline=time.monotonic() + 3.0, detach_reserve_s=0.5)
    try:
        with pytest.raises(DebuggerGone):
            s.attach(sleeper.pid)
        assert attach_refusal(sleeper.pid) == f"process {sleeper.pid} is already traced by pid {s.proc.pid}"
    finally:
        s.close()


@needs_gdb
@needs_ptrace
def test_a_real_ptrace_denial_is_a_one_line_reason(sleeper, tmp_path):
    """gdb run as an unprivileged user (setpriv) against our process: the kernel says no."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run gdb as another user")
    wrapper = tmp_path / "gdb"
    wrapper.write_text(f"#!/bin/sh\nexec {setpriv} --reuid=65534 --regid=65534 --clear-groups "
                       f"--inh-caps=-all --bounding-set=-all {shutil.which('gdb')} \"$@\"\n")
    wrapper.chmod(0o755)
    with DebuggerSession(str(wrapper), deadline=time.monotonic() + 15) as s:
        with pytest.raises(AttachRefused) as err:
            s.attach(sleeper.pid)
    assert "Operation not permitted" in str(err.value) and "\n" not in str(err.value)
    assert tracer_of(sleeper.pid) == 0 and stopped_tasks(sleeper.pid) == []


def test_no_debugger_on_path_is_none():
    assert find_debugger(path="/nonexistent-dir") is None
