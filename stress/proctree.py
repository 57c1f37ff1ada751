"""Find and end a process tree: a /proc scan, pidfd signalling, and a verified kill.

Linux only (/proc, pidfds from kernel 5.3). Signals to single processes go through pidfds
so a recycled pid is never hit; the group is signalled with killpg while its leader is
still unreaped, so the group id cannot have been recycled either.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import select
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Iterator, TypeVar

import psutil

KILL_WAIT_S = 1.0  # after SIGKILL, how long to wait for the kernel to finish a process


def _pidfds_work() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):  # not Linux >= 5.3: psutil polling instead
        return False


PIDFDS = _pidfds_work()


def _read_proc(path: str, whole: bool = True) -> bytes | None:
    # os.open/os.read: a third of the cost of open() for these tiny generated files.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, 65536)]
        while whole and chunks[-1]:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, process group, start time in clock ticks) of a pid, None if gone."""
    raw = _read_proc(f"/proc/{pid}/stat", whole=False)
    if raw is None:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    return fields[0].decode(), int(fields[2]), int(fields[19])


def start_ticks(pid: int) -> int:
    """A process's start time in clock ticks since boot (0 if it is gone)."""
    stat = _proc_stat(pid)
    return stat[2] if stat else 0


def _is_running(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def scan_for(pgid: int, mark: bytes | None = None, since_ticks: int = 0) -> set[int]:
    """Live pids (not zombies) in process group `pgid` or carrying env marker `mark`.

    Only processes started at or after `since_ticks` can carry the marker (they descend
    from a child started then), so older ones are not read: the scan stays ~1 ms.
    """
    found = set()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == me:
            continue
        stat = _proc_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        if stat[1] == pgid:
            found.add(pid)
            continue
        if not mark or stat[2] < since_ticks:
            continue
        environ = _read_proc(f"/proc/{pid}/environ")
        if environ and mark in environ:
            found.add(pid)
    return found


def _open_pidfds(pids: set[int]) -> dict[int, int]:
    fds = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except OSError:  # already gone
            continue
    return fds


def _wait_gone(pidfds: dict[int, int], timeout: float) -> None:
    """Block until every pidfd's process has exited, or `timeout` passes. No polling sleeps."""
    poller = select.poll()
    for fd in pidfds.values():
        poller.register(fd, select.POLLIN)
    pending = set(pidfds.values())
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        for fd, _ in poller.poll(left * 1000):
            pending.discard(fd)
            poller.unregister(fd)


def _signal_and_wait(pgid: int | None, pids: set[int], sig: int, wait_s: float) -> None:
    """Send `sig` to the group (if given) and to each of `pids`; wait for them to exit."""
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    if not PIDFDS:
        procs = []
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                proc.send_signal(sig)
            except psutil.Error:
                continue
            if pid != pgid:  # waiting would reap the leader: the group id must stay ours
                procs.append(proc)
        psutil.wait_procs(procs, timeout=wait_s)
        return
    pidfds = _open_pidfds(pids)
    try:
        for fd in pidfds.values():
            try:
                signal.pidfd_send_signal(fd, sig)
            except OSError:
                pass
        _wait_gone(pidfds, wait_s)
    finally:
        for fd in pidfds.values():
            os.close(fd)


def pipe_holders(inodes: set[int]) -> set[int]:
    """Live pids (not ours) holding an fd on one of these pipe inodes.

    Only descendants can hold a child's output pipe (the supervisor starts children with
    close_fds), so a holder found after the kill is a descendant that escaped both the
    group and the marker scan. Reads every /proc/<pid>/fd: used only on that rare path.
    """
    names = {f"pipe:[{inode}]" for inode in inodes}
    found = set()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry.name}/fd/{fd}") in names:
                    if _is_running(int(entry.name)):
                        found.add(int(entry.name))
                    break
            except OSError:
                continue
    return found


def kill_pids(pids: set[int], grace_s: float) -> list[int]:
    """SIGTERM `pids`, wait `grace_s`, SIGKILL the rest; return those still running."""
    _signal_and_wait(None, pids, signal.SIGTERM, grace_s)
    rest = {p for p in pids if _is_running(p)}
    if rest:
        _signal_and_wait(None, rest, signal.SIGKILL, KILL_WAIT_S)
    return sorted(p for p in rest if _is_running(p))


def cgroup_pids(cgroup: str | None) -> set[int]:
    """Live members of a cgroup v2 folder (empty when it is None or gone). Exited
    processes leave a cgroup's member list at once, zombies included."""
    if not cgroup:
        return set()
    raw = _read_proc(os.path.join(cgroup, "cgroup.procs"))
    return {int(x) for x in raw.split()} if raw else set()


def kill_cgroup(cgroup: str) -> None:
    """SIGKILL every member of a cgroup v2 folder at once (cgroup.kill, Linux 5.14), or
    one by one until none is left on older kernels. Nothing escapes a cgroup: not setsid,
    not a double fork, not a cleared environment or closed descriptors."""
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        fd = None
    if fd is not None:
        try:
            os.write(fd, b"1")
            return
        except OSError:
            pass
        finally:
            os.close(fd)
    for _ in range(100):  # members fork while we kill: repeat until the list is empty
        pids = cgroup_pids(cgroup)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)  # a member of our cgroup: not a recycled pid
            except OSError:
                pass


def remove_cgroup(cgroup: str, wait_s: float = KILL_WAIT_S) -> bool:
    """Remove an emptied cgroup folder (waiting up to `wait_s` for its last member to
    finish exiting); True when it is gone."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(cgroup)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def reap_adopted(pids: set[int], leader: int | None = None) -> None:
    """Collect the exit status of those of `pids` that are our children (orphans adopted
    because this process is a child subreaper) and have exited, so none stays a zombie.
    `leader` is left to its Popen. Only pids of one run are passed: never another's child."""
    for pid in pids:
        if pid == leader:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not ours (reparented to init, or already collected)
            pass


class ToolGroups:
    """The process groups of the tools (`start_in_group`) that one phase of work started, in
    this thread and in the worker threads it hands its context to, so that the phase can end
    its own tools and no other. One process runs several phases at once (a check's static
    part beside its family builds and its GPU part): "every child started since the phase
    began" also holds the other phases' compilers (an H200 check's nvcc was SIGKILLed so, by
    the family builds' phase ending beside it) and forensics' debuggers.

    Scopes nest: one made inside another's block (a static phase in the static part) is
    within it, and a tool registers in every scope it is within."""

    def __init__(self) -> None:
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._killed = False
        self._parent = _TOOL_GROUPS.get()

    @contextlib.contextmanager
    def current(self) -> Iterator["ToolGroups"]:
        """Within this block (and in contexts copied from it), tools register here."""
        token = _TOOL_GROUPS.set(self)
        try:
            yield self
        finally:
            _TOOL_GROUPS.reset(token)

    def _add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.add(proc)
            killed = self._killed
        if killed:  # started by a worker after the phase was ended: it ends too
            kill_whole_group(proc)

    def _discard(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(proc)

    def kill(self) -> None:
        """SIGKILL the group of each tool of this scope still running, and of any it starts
        from now on. A leader that has exited is skipped (its group id may be reused once
        it is reaped): the same check as `Popen.send_signal`'s."""
        with self._lock:
            self._killed = True
            procs = list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                kill_whole_group(proc)

    @staticmethod
    def each_current() -> Iterator["ToolGroups"]:
        scope = _TOOL_GROUPS.get()
        while scope is not None:
            yield scope
            scope = scope._parent


_TOOL_GROUPS: contextvars.ContextVar[ToolGroups | None] = contextvars.ContextVar("hz_tool_groups", default=None)


def start_in_group(argv: list[str], **popen_kw: Any) -> subprocess.Popen:
    """`subprocess.Popen(argv)` as the leader of a process group of its own (a tool that
    starts children: nvcc, a build's shell), stdin from /dev/null, stdout and stderr piped
    unless `popen_kw` says otherwise, registered in the current `ToolGroups` scopes. End it
    with `communicate_or_kill_group`, or with `kill_whole_group` and then `forget_tool`."""
    popen_kw.setdefault("stdin", subprocess.DEVNULL)
    popen_kw.setdefault("stdout", subprocess.PIPE)
    popen_kw.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.Popen(argv, start_new_session=True, **popen_kw)
    for scope in ToolGroups.each_current():
        scope._add(proc)
    return proc


def forget_tool(proc: subprocess.Popen) -> None:
    """Take a tool that has ended (`start_in_group`) out of the current `ToolGroups` scopes, in
    the context that started it: a long phase (a soak's) would otherwise keep every tool it ran."""
    for scope in ToolGroups.each_current():
        scope._discard(proc)


def kill_and_reap(proc: subprocess.Popen) -> None:
    """SIGKILL to `proc` alone, then reap it within KILL_WAIT_S (no zombie left); a process the
    kernel cannot finish (D state inside a driver after an Xid) is left after that, not waited on
    forever."""
    proc.kill()
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        pass


def kill_whole_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group `proc` leads (`start_in_group`): the tool and every child
    it started. Call it while `proc` is unreaped, so that its pid is still the group's id."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def communicate_or_kill_group(proc: subprocess.Popen, timeout_s: float, input: Any = None) -> tuple[Any, Any]:
    """`proc.communicate(input, timeout=timeout_s)` for a process started with
    `start_new_session=True` (a build's shell). On a timeout or an interruption (Ctrl-C) its
    whole process group is killed, while the shell is still unreaped, and reaped; then the
    exception goes on (`subprocess.TimeoutExpired` for a timeout, holding in `stdout` and
    `stderr` what the tool printed up to the kill, decoded like the output). Killing only the shell
    would leave the compiler it started running."""
    try:
        out = proc.communicate(input, timeout=timeout_s)
    except BaseException as exc:
        kill_whole_group(proc)
        _note_killed()
        stdout, stderr = proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):  # what it printed up to the kill, as subprocess.run's
            exc.stdout, exc.stderr = stdout, stderr
        raise
    finally:
        forget_tool(proc)
    if proc.returncode == -signal.SIGKILL:  # its phase ended (ToolGroups.kill) or the kernel's OOM killer
        _note_killed()
    return out


def run_in_group(argv: list[str], timeout_s: float, *, input: Any = None,
                 **popen_kw: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, input=input, capture_output=True, timeout=timeout_s)` for a tool
    that starts children of its own (nvcc runs cicc, ptxas and gcc): in its own process group,
    stdin from /dev/null unless `input` is given, the whole group killed on a timeout, Ctrl-C
    or its phase's end (`communicate_or_kill_group`, `ToolGroups`; `subprocess.TimeoutExpired`
    goes on). `popen_kw`: text, errors, cwd, env."""
    if input is not None:
        popen_kw["stdin"] = subprocess.PIPE
    proc = start_in_group(argv, **popen_kw)
    stdout, stderr = communicate_or_kill_group(proc, timeout_s, input)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


# The `cache_unless_killed` calls under way in this context: each is told when a tool run
# through `communicate_or_kill_group` was killed while it ran.
_KILL_WATCHES: contextvars.ContextVar[tuple[list[bool], ...]] = contextvars.ContextVar("hz_kill_watches",
                                                                                        default=())


def _note_killed() -> None:
    for watch in _KILL_WATCHES.get():
        watch.append(True)


class _AnsweredWhileKilled(Exception):
    """Carries a probe's answer past `functools.lru_cache`, which keeps no raised call."""

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer


Probe = TypeVar("Probe", bound=Callable[..., Any])


def cache_unless_killed(probe: Probe) -> Probe:
    """`functools.lru_cache(maxsize=None)` for a probe that answers from what the tools it runs
    (`run_in_group`) print, keeping no answer given while one of them was killed (its time
    limit, its phase's end, SIGKILL): that answer is the probe's fallback, not the tool's, so
    it is returned once and the next call asks again. Kept, a long-lived process (a soak)
    would answer with it for good. A probe that calls another counts the other's kills too.
    `cache_clear` and `__wrapped__` as lru_cache's."""
    @functools.lru_cache(maxsize=None)
    def kept(*args: Any, **kwargs: Any) -> Any:
        killed: list[bool] = []
        token = _KILL_WATCHES.set((*_KILL_WATCHES.get(), killed))
        try:
            answer = probe(*args, **kwargs)
        finally:
            _KILL_WATCHES.reset(token)
        if killed:
            raise _AnsweredWhileKilled(answer)
        return answer

    @functools.wraps(probe)
    def cached(*args: Any, **kwargs: Any) -> Any:
        try:
            return kept(*args, **kwargs)
        except _AnsweredWhileKilled as once:
            return once.answer

    cached.cache_clear = kept.cache_clear  # type: ignore[attr-defined]
    cached.cache_info = kept.cache_info  # type: ignore[attr-defined]
    return cached  # type: ignore[return-value]


def kill_group(pgid: int, *, grace_s: float, known_pids: set[int] = frozenset(),
               mark: bytes | None = None, since_ticks: int = 0,
               leader: subprocess.Popen | None = None, cgroup: str | None = None) -> dict[str, Any]:
    """SIGTERM the group and every known, marked or cgroup-member descendant, wait
    `grace_s`, SIGKILL what is left (the whole `cgroup` at once), then verify. Returns
    evidence: `killed` (pids signalled), `sigkill` (pids that needed SIGKILL) and
    `survivors` (pids still running: [] when clean).

    `leader` (the group leader's Popen) is reaped only after the group was signalled, so
    the group id cannot be recycled while we still signal it. The emptied cgroup is removed.
    """
    def victims() -> set[int]:
        return (scan_for(pgid, mark, since_ticks) | cgroup_pids(cgroup)
                | {p for p in known_pids if _is_running(p)})

    evidence: dict[str, Any] = {"killed": [], "sigkill": [], "survivors": []}
    first = victims()
    rest: set[int] = set()
    if first:
        evidence["killed"] = sorted(first)
        _signal_and_wait(pgid, first, signal.SIGTERM, grace_s)
        rest = victims()  # includes anything forked during the grace period
        if rest:
            evidence["sigkill"] = sorted(rest)
            evidence["killed"] = sorted(first | rest)
            if cgroup:
                kill_cgroup(cgroup)
            _signal_and_wait(pgid, rest, signal.SIGKILL, KILL_WAIT_S)
    if leader is not None:
        try:
            leader.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    reap_adopted(first | rest | set(known_pids), leader.pid if leader is not None else None)
    # Nothing was running a moment ago: no need to look twice.
    evidence["survivors"] = [_describe(pid) for pid in sorted(victims())] if first else []
    if cgroup and not evidence["survivors"] and not remove_cgroup(cgroup):
        evidence["survivors"] += [_describe(pid) for pid in sorted(cgroup_pids(cgroup))]
    return evidence


def _describe(pid: int) -> dict[str, Any]:
    try:
        p = psutil.Process(pid)
        return {"pid": pid, "name": p.name(), "status": p.status()}
    except psutil.Error:
        return {"pid": pid}


def still_same(p: psutil.Process) -> bool:
    """True if the process `p` names is still that process and still running."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
