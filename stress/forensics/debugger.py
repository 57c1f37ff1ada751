"""Driving a debugger (cuda-gdb, rocgdb or gdb) against a hung process, safely and on time.

One `DebuggerSession` is one gdb process talking to us over a pipe: we send a command,
then an `echo` of a unique marker, and read until the marker comes back, so each
command's output is known exactly and a command that takes too long is noticed. The
session attaches with the `attach` command (so the attach is timed and its refusal is
read like any other output), and `close()` always ends with the tracee running: `detach`
when there is time, otherwise the debugger is killed (the kernel then detaches it) and a
tracee left in a stop is sent SIGCONT. The debugger carries the supervisor's environment
marker, so the watchdog's kill also finds a debugger that somehow outlived its session.
More in docs/hang-forensics.md.
"""
from __future__ import annotations

import dataclasses
import os
import re
import select
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterable

from ..proctree import forget_tool, kill_whole_group, start_in_group

DEBUGGERS = ("cuda-gdb", "rocgdb", "gdb")  # in order of preference for a GPU process
HOST_DEBUGGERS = ("gdb", "cuda-gdb", "rocgdb")  # for host stacks only: plain gdb starts fastest
PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
CAP_SYS_PTRACE = 19
DETACH_RESERVE_S = 1.5  # kept back from the budget for `detach` + `quit`
_PROMPT = re.compile(r"^(?:\((?:cuda-gdb|gdb|rocgdb)\) )+")
_SETUP = ("set pagination off", "set height 0", "set width 0", "set confirm off", "set print asm-demangle on",
          "set print pretty off", "set debuginfod enabled off")
# gdb's words for a refused attach, as printed by the `attach` command.
_REFUSED = re.compile(r"ptrace: (Operation not permitted|No such process)[^\n]*|"
                      r"Could not attach to process[^\n]*|Unable to attach[^\n]*|"
                      r"Can't attach[^\n]*|warning: process \d+ is already traced[^\n]*")


def find_debugger(names: Iterable[str] = DEBUGGERS, path: str | None = None) -> str | None:
    """The first of `names` found on PATH (or `path`), as an absolute path; None if none."""
    for name in names:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def _status_field(pid: int | str, field: str) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def has_cap_sys_ptrace(pid: int | str = "self") -> bool:
    """True when `pid` (default: this process) holds CAP_SYS_PTRACE in its effective set."""
    eff = _status_field(pid, "CapEff")
    return eff is not None and bool(int(eff, 16) >> CAP_SYS_PTRACE & 1)


def tracer_of(pid: int) -> int:
    """Pid of the process tracing `pid` (0: none or unknown)."""
    value = _status_field(pid, "TracerPid")
    return int(value) if value and value.isdigit() else 0


def attach_refusal(pid: int, *, scope_file: Path = PTRACE_SCOPE) -> str | None:
    """Why a debugger started by this process could not attach to `pid`; None if it may.

    The checks the kernel will make, in words: the target is gone, it is already traced,
    Yama forbids attaching (scope 3), or needs CAP_SYS_PTRACE that we lack (scope 1
    allows only ancestors, and the debugger is not the target's ancestor; scope 2 admin
    only), or the target runs as another user and we lack CAP_SYS_PTRACE.
    """
    if not Path(f"/proc/{pid}").exists():
        return f"process {pid} is gone"
    tracer = tracer_of(pid)
    if tracer:
        return f"process {pid} is already traced by pid {tracer}"
    cap = has_cap_sys_ptrace()
    try:
        scope = int(scope_file.read_text().strip())
    except (OSError, ValueError):
        scope = 0  # no Yama: classic rules
    if scope >= 3:
        return f"ptrace is disabled on this machine ({scope_file} = {scope})"
    if scope in (1, 2) and not cap:
        return (f"ptrace not permitted: {scope_file} = {scope} and this process lacks CAP_SYS_PTRACE "
                "(run with --cap-add SYS_PTRACE, or set ptrace_scope to 0)")
    uid = _status_field(pid, "Uid")
    if uid is not None and int(uid.split()[1]) != os.geteuid() and not cap:
        return f"ptrace not permitted: process {pid} runs as uid {uid.split()[1]} and this process lacks CAP_SYS_PTRACE"
    return None


def stopped_tasks(pid: int) -> list[int]:
    """Threads of `pid` in a stop (state T or t)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_bytes()
        except OSError:
            continue
        state = raw[raw.rfind(b")") + 2:].split()[0]
        if state in (b"T", b"t"):
            out.append(int(tid))
    return out


def resume_if_stopped(pid: int) -> str | None:
    """Send SIGCONT when `pid` is left stopped with no tracer; a note saying so, or None."""
    if tracer_of(pid) or not stopped_tasks(pid):
        return None
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError as e:
        return f"process {pid} was left stopped and SIGCONT failed: {e.strerror}"
    return f"process {pid} was left stopped after the debugger ended: sent SIGCONT"


@dataclasses.dataclass
class CommandOutput:
    """One debugger command and what it printed (stdout and stderr interleaved)."""

    command: str
    text: str
    seconds: float
    complete: bool  # False: the deadline came before the command finished


class DebuggerGone(Exception):
    """The debugger exited or stopped answering."""


class AttachRefused(DebuggerGone):
    """The debugger could not attach (ptrace denied, process gone, already traced)."""


class DebuggerSession:
    """A debugger process fed commands over a pipe, with a hard deadline (monotonic).

    Use as a context manager; `close()` detaches (or kills the debugger) and makes sure the
    tracee is not left stopped. `transcript` keeps every command and its output.
    """

    def __init__(self, debugger: str, *, deadline: float, env: dict[str, str] | None = None,
                 detach_reserve_s: float = DETACH_RESERVE_S) -> None:
        self.debugger = debugger
        self.deadline = deadline
        self.detach_reserve_s = detach_reserve_s
        self.transcript: list[CommandOutput] = []
        self.notes: list[str] = []
        self.attached_pid: int | None = None
        self._buf = b""
        self._answering = True  # False once a command overran: the debugger may be wedged
        self._token = uuid.uuid4().hex[:12]
        self._n = 0
        run_env = dict(os.environ if env is None else env)
        run_env.setdefault("TERM", "dumb")
        self.proc = start_in_group([debugger, "-q", "-nx", "-nh"], stdin=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, env=run_env)
        os.set_blocking(self.proc.stdout.fileno(), False)
        try:
            for cmd in _SETUP:
                self.run(cmd, record=False)
        except DebuggerGone:
            self.close()
            raise

    # -- talking -----------------------------------------------------------------------
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, command: str, *, budget_s: float | None = None, record: bool = True) -> CommandOutput:
        """Send `command`; wait for its output until its share of the deadline runs out.

        `budget_s` caps this command; the session keeps `detach_reserve_s` for closing.
        Raises DebuggerGone when the debugger exits or a command overruns (the session is
        then unusable: close() kills it).
        """
        self._n += 1
        marker = f"__HZ_{self._token}_{self._n}__"
        limit = time.monotonic() + max(0.0, self.remaining() - self.detach_reserve_s)
        if budget_s is not None:
            limit = min(limit, time.monotonic() + budget_s)
        t0 = time.monotonic()
        try:
            self.proc.stdin.write(f"{command}\necho \\n{marker}\\n\n".encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise DebuggerGone(f"debugger exited ({e})") from None
        text, complete = self._read_until(marker.encode(), limit)
        out = CommandOutput(command, _clean(text), round(time.monotonic() - t0, 3), complete)
        if record:
            self.transcript.append(out)
        if not complete:
            self._answering = False
            alive = self.proc.poll() is None
            raise DebuggerGone(f"`{command}` did not finish within its time" if alive
                               else f"debugger exited during `{command}`")
        return out

    def _read_until(self, marker: bytes, limit: float) -> tuple[str, bool]:
        fd = self.proc.stdout.fileno()
        while True:
            at = self._buf.find(b"\n" + marker)
            if at >= 0:
                text = self._buf[:at]
                self._buf = self._buf[at + 1 + len(marker):]
                return text.decode("utf-8", "replace"), True
            wait = limit - time.monotonic()
            if wait <= 0:
                text, self._buf = self._buf, b""
                return text.decode("utf-8", "replace"), False
            ready, _, _ = select.select([fd], [], [], min(wait, 0.2))
            if not ready:
                if self.proc.poll() is not None:
                    text, self._buf = self._buf, b""
                    return text.decode("utf-8", "replace"), False
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                text, self._buf = self._buf, b""
                return text.decode("utf-8", "replace"), False
            self._buf += chunk

    # -- attach / detach ---------------------------------------------------------------
    def attach(self, pid: int) -> CommandOutput:
        """`attach PID`; raises DebuggerGone with gdb's one-line reason when refused."""
        self.attached_pid = pid  # from now on close() checks that `pid` is left running
        out = self.run(f"attach {pid}")
        refused = _REFUSED.search(out.text)
        if refused or not re.search(r"Attaching to (process|program)", out.text):
            why = refused.group(0) if refused else (out.text.strip().splitlines() or ["no answer"])[-1]
            raise AttachRefused(f"{Path(self.debugger).name} could not attach: {why.strip()}")
        return out

    def close(self) -> None:
        """Detach if attached and time allows, quit, and leave the tracee running. Idempotent."""
        if self.proc.poll() is None:
            if self.attached_pid is not None and self.remaining() > 0.2 and self._answering:
                try:
                    self.detach_reserve_s = 0.0
                    self.run("detach", budget_s=max(0.1, self.remaining()))
                except DebuggerGone as e:
                    self.notes.append(f"detach failed ({e}): debugger killed")
            try:
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=max(0.05, min(0.5, self.remaining())))
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            kill_whole_group(self.proc)
            self.proc.wait()
        forget_tool(self.proc)  # ended: its phase's ToolGroups need not keep it
        for stream in (self.proc.stdout, self.proc.stdin):
            try:
                stream.close()
            except OSError:
                pass
        if self.attached_pid is not None:
            # The kernel detaches a dead tracer's tracees; a stop may remain: undo it.
            for _ in range(20):
                if not tracer_of(self.attached_pid):
                    break
                time.sleep(0.01)
            note = resume_if_stopped(self.attached_pid)
            if note:
                self.notes.append(note)
            self.attached_pid = None

    def __enter__(self) -> "DebuggerSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _clean(text: str) -> str:
    """Output without gdb's prompts and the echoed blank line before the marker."""
    lines = [_PROMPT.sub("", ln) for ln in text.splitlines()]
    while lines and not lines[-1].strip():
        lines.pop()
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)
