"""Supervise one child process: own process group, bounded output tails, hang collectors,
and a kill that verifies nothing it started survives.

The supervisor never imports a GPU library: a hung kernel or a sticky CUDA error lives in
the child, and the child's whole process group can always be killed from here.

How descendants are found when it is time to kill (any of the three suffices):
1. the child's process group (the child runs with `start_new_session=True`);
2. descendants sampled with psutil while the run is going (children that were later
   reparented to init are still known);
3. an environment marker `HZ_SUPERVISED_<token>=1` inherited by every descendant that did
   not clear its environment: a scan of /proc finds processes that called setsid() and
   were reparented before any sample saw them.
Signals to processes outside the group go through pidfds, so a recycled pid is never hit.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import select
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import psutil

TAIL_BYTES = 64 * 1024          # kept in memory per stream for classification
NOTABLE_KEEP = 50               # first and last notable lines kept per stream
COLLECTOR_BUDGET_S = 10.0       # all on-hang collectors together, per hang
KILL_WAIT_S = 1.0               # after SIGKILL, how long to wait for the kernel to reap
MARK_PREFIX = "HZ_SUPERVISED_"

_HAS_PIDFD = hasattr(os, "pidfd_open")


@dataclasses.dataclass
class HangContext:
    """What an on-hang collector gets: the hung child is still alive while it runs."""

    pid: int
    pgid: int
    argv: list[str]
    target: str
    started_at: float
    artifact_dir: Path | None
    env: dict[str, str]


HangCollector = Callable[[HangContext], "dict[str, Any] | None"]
_collectors: list[HangCollector] = []
_collectors_lock = threading.Lock()


def register_on_hang(fn: HangCollector) -> None:
    """Call `fn(ctx)` on every hang, before the child is signalled. Idempotent."""
    with _collectors_lock:
        if fn not in _collectors:
            _collectors.append(fn)


def unregister_on_hang(fn: HangCollector) -> None:
    """Stop calling `fn` on hangs (no error if it was not registered)."""
    with _collectors_lock:
        if fn in _collectors:
            _collectors.remove(fn)


def _jsonable(value: Any) -> Any:
    """Collector output as stored: JSON-safe (unknown objects become their str)."""
    return json.loads(json.dumps(value, default=str))


def run_collectors(ctx: HangContext, budget_s: float = COLLECTOR_BUDGET_S) -> dict[str, Any]:
    """Run every registered collector on `ctx`; return {name: output or {"error": ...}}.

    Each runs in its own thread against one shared time budget, so a collector that
    raises or blocks is recorded as evidence and never takes the supervisor down.
    """
    with _collectors_lock:
        fns = list(_collectors)
    deadline = time.monotonic() + budget_s
    results: dict[str, Any] = {}
    for fn in fns:
        name = getattr(fn, "__qualname__", None) or repr(fn)
        while name in results:
            name += "'"
        box: dict[str, Any] = {}

        def call(fn: HangCollector = fn, box: dict[str, Any] = box) -> None:
            try:
                box["out"] = fn(ctx)
            except BaseException as exc:  # noqa: BLE001 - a collector must never kill us
                box["error"] = f"{type(exc).__name__}: {exc}"

        worker = threading.Thread(target=call, name=f"hz-collector-{name}", daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            results[name] = {"error": f"still running after the {budget_s:g}s collector budget"}
        elif "error" in box:
            results[name] = {"error": box["error"]}
        else:
            try:
                results[name] = _jsonable(box.get("out"))
            except (TypeError, ValueError) as exc:
                results[name] = {"error": f"output not JSON-serialisable: {exc}"}
    return results


class Drain(threading.Thread):
    """Reads one pipe to EOF: a bounded tail, an optional full log, and notable lines.

    Notable lines (fault signatures, result lines, tracebacks: `notable_re`) are kept
    even when they scroll out of the tail: the first and the last `NOTABLE_KEEP`.
    """

    def __init__(self, fd: int, *, name: str, tail_bytes: int = TAIL_BYTES,
                 log_path: Path | None = None, notable_re: Any = None) -> None:
        super().__init__(name=f"hz-drain-{name}", daemon=True)
        self.fd = fd
        self.total = 0
        self._tail = bytearray()
        self._cap = tail_bytes
        self._log_path = log_path
        self._notable_re = notable_re
        self._carry = b""
        self._first: list[str] = []
        self._last: collections.deque[str] = collections.deque(maxlen=NOTABLE_KEEP)
        self._lock = threading.Lock()

    def run(self) -> None:
        log = open(self._log_path, "wb") if self._log_path else None
        try:
            while True:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    break
                if not data:
                    break
                if log:
                    log.write(data)
                self._scan(data)
                with self._lock:
                    self.total += len(data)
                    self._tail += data
                    if len(self._tail) > 2 * self._cap:
                        del self._tail[:-self._cap]
            self._scan(b"\n")  # the last line may lack its newline
        finally:
            if log:
                log.close()

    def _scan(self, data: bytes) -> None:
        if self._notable_re is None:
            return
        text = self._carry + data
        cut = text.rfind(b"\n") + 1
        if cut == 0 and len(text) < self._cap:
            self._carry = text
            return
        complete, self._carry = (text[:cut], text[cut:]) if cut else (text, b"")
        decoded = complete.decode("utf-8", "replace")
        for m in self._notable_re.finditer(decoded):
            start = decoded.rfind("\n", 0, m.start()) + 1
            end = decoded.find("\n", m.end())
            line = decoded[start:end if end >= 0 else len(decoded)][:1000]
            with self._lock:
                if len(self._first) < NOTABLE_KEEP:
                    self._first.append(line)
                elif not self._last or self._last[-1] != line:
                    self._last.append(line)

    def tail(self) -> bytes:
        """The last `tail_bytes` bytes read so far."""
        with self._lock:
            return bytes(self._tail[-self._cap:])

    def text(self) -> str:
        """What classification reads: the notable lines, then the tail, as text."""
        with self._lock:
            notable = self._first + list(self._last)
            tail = bytes(self._tail[-self._cap:])
        body = tail.decode("utf-8", "replace")
        return "\n".join(notable) + "\n" + body if notable else body


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
        except (ProcessLookupError, OSError):
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


def _signal_all(pgid: int, pidfds: dict[int, int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for fd in pidfds.values():
        try:
            signal.pidfd_send_signal(fd, sig)
        except (ProcessLookupError, OSError):
            pass


def _signal_and_wait(pgid: int, pids: set[int], sig: int, wait_s: float) -> None:
    """Send `sig` to the group and to each of `pids` (by pidfd); wait for them to exit."""
    pidfds = _open_pidfds(pids)
    try:
        _signal_all(pgid, pidfds, sig)
        _wait_gone(pidfds, wait_s)
    finally:
        for fd in pidfds.values():
            os.close(fd)


def kill_group(pgid: int, *, grace_s: float, known_pids: set[int] = frozenset(),
               mark: bytes | None = None, since_ticks: int = 0,
               leader: subprocess.Popen | None = None) -> dict[str, Any]:
    """SIGTERM the group and every known or marked descendant, wait `grace_s`, SIGKILL
    what is left, then verify. Returns evidence: `killed` (pids signalled), `sigkill`
    (pids that needed SIGKILL) and `survivors` (pids still running: [] when clean).

    `leader` (the group leader's Popen) is reaped only after the group was signalled, so
    the group id cannot be recycled while we still signal it.
    """
    def victims() -> set[int]:
        return scan_for(pgid, mark, since_ticks) | {p for p in known_pids if _is_running(p)}

    evidence: dict[str, Any] = {"killed": [], "sigkill": [], "survivors": []}
    first = victims()
    if first:
        evidence["killed"] = sorted(first)
        _signal_and_wait(pgid, first, signal.SIGTERM, grace_s)
        rest = victims()  # includes anything forked during the grace period
        if rest:
            evidence["sigkill"] = sorted(rest)
            evidence["killed"] = sorted(first | rest)
            _signal_and_wait(pgid, rest, signal.SIGKILL, KILL_WAIT_S)
    if leader is not None:
        try:
            leader.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    # Nothing was running a moment ago: no need to look twice.
    evidence["survivors"] = [_describe(pid) for pid in sorted(victims())] if first else []
    return evidence


def _describe(pid: int) -> dict[str, Any]:
    try:
        p = psutil.Process(pid)
        return {"pid": pid, "name": p.name(), "status": p.status()}
    except psutil.Error:
        return {"pid": pid}


class Supervised:
    """One child in its own session and process group, its output drained into tails.

    `line_stdout=True` leaves stdout to the caller (server protocol) as a non-blocking fd;
    otherwise stdout is drained like stderr. With `log_dir`, full logs are written there
    as stdout.log / stderr.log. Raises OSError if the program cannot be started.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str | None = None,
                 target: str = "", stdin: bool = False, line_stdout: bool = False,
                 log_dir: Path | None = None, grace_s: float = 2.0,
                 notable_re: Any = None, sample_every_s: float = 0.25) -> None:
        self.argv = list(argv)
        self.target = target
        self.grace_s = grace_s
        token = uuid.uuid4().hex
        self.mark = f"{MARK_PREFIX}{token}=".encode()
        self.env = dict(env)
        self.env[f"{MARK_PREFIX}{token}"] = "1"
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, cwd=cwd,
            env=self.env, start_new_session=True, close_fds=True)
        self.pid = self.proc.pid
        self.pgid = self.pid  # setsid() made it the leader of a new session and group
        self.pidfd: int | None = os.pidfd_open(self.pid) if _HAS_PIDFD else None
        self._start_ticks = start_ticks(self.pid)
        self._tracked: dict[int, psutil.Process] = {}
        self._next_sample = 0.02
        self._sample_every = sample_every_s
        self._killed: dict[str, Any] | None = None
        self.stdin_fd = self.proc.stdin.fileno() if stdin else None
        self.stdout_fd = self.proc.stdout.fileno()
        if line_stdout:
            os.set_blocking(self.stdout_fd, False)
            if self.stdin_fd is not None:
                os.set_blocking(self.stdin_fd, False)
            self.stdout_drain = None
        else:
            self.stdout_drain = Drain(self.stdout_fd, name="stdout", notable_re=notable_re,
                                      log_path=log_dir / "stdout.log" if log_dir else None)
            self.stdout_drain.start()
        self.stderr_drain = Drain(self.proc.stderr.fileno(), name="stderr", notable_re=notable_re,
                                  log_path=log_dir / "stderr.log" if log_dir else None)
        self.stderr_drain.start()

    # -- state ---------------------------------------------------------------------
    def exit_status(self) -> int | None:
        """Popen-style return code if the child has exited (without reaping it), else None."""
        if self.proc.returncode is not None:
            return self.proc.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.proc.returncode
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def sample_descendants(self) -> None:
        """Remember every current descendant, so a later reparenting cannot hide it."""
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                self._tracked.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def maybe_sample(self) -> None:
        """Sample descendants if due: often at first, then every `sample_every_s`."""
        now = self.elapsed()
        if now >= self._next_sample:
            self.sample_descendants()
            self._next_sample = now + min(self._sample_every, max(0.02, now / 2))

    def wait_exit(self, deadline: float) -> bool:
        """Wait (monotonic `deadline`) for the child to exit; sample descendants meanwhile."""
        while True:
            if self.exit_status() is not None:
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            self.maybe_sample()
            wake = min(deadline, self._t0 + self._next_sample) - now
            if self.pidfd is not None:
                select.select([self.pidfd], [], [], max(0.0, wake))
            else:
                time.sleep(min(max(0.0, wake), 0.001))

    # -- output ----------------------------------------------------------------------
    def stdout_text(self) -> str:
        return self.stdout_drain.text() if self.stdout_drain else ""

    def stderr_text(self) -> str:
        return self.stderr_drain.text()

    # -- ending ----------------------------------------------------------------------
    def hang(self, artifact_dir: Path | None = None) -> dict[str, Any]:
        """Run the on-hang collectors on the live child, then kill. Returns evidence."""
        ctx = HangContext(pid=self.pid, pgid=self.pgid, argv=list(self.argv),
                          target=self.target, started_at=self.started_at,
                          artifact_dir=artifact_dir, env=dict(self.env))
        collected = run_collectors(ctx)
        evidence = self.kill()
        evidence["collectors"] = collected
        return evidence

    def kill(self) -> dict[str, Any]:
        """Terminate the group and every descendant, reap the child, verify. Idempotent.

        Also the normal end of a run: after a clean exit it finds and kills leftovers
        (background processes the child left behind) and returns them under `killed`.
        """
        if self._killed is not None:
            return dict(self._killed)
        if self.exit_status() is None:
            self.sample_descendants()
        known = {pid for pid, p in self._tracked.items() if _still_same(p)}
        evidence = kill_group(self.pgid, grace_s=self.grace_s, known_pids=known,
                              mark=self.mark, since_ticks=self._start_ticks, leader=self.proc)
        for drain in (self.stdout_drain, self.stderr_drain):
            if drain is not None:
                drain.join(timeout=KILL_WAIT_S)
        self._close_fds()
        self._killed = evidence
        return dict(evidence)

    def _close_fds(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        for stream, drain in ((self.proc.stdin, None), (self.proc.stdout, self.stdout_drain),
                              (self.proc.stderr, self.stderr_drain)):
            # A drain still blocked in read() (a survivor holds the pipe) keeps its fd.
            if stream is not None and (drain is None or not drain.is_alive()):
                try:
                    stream.close()
                except OSError:
                    pass


def _still_same(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
