"""Supervise one child: its own process group, bounded output tails, hang collectors, a verified kill.

The supervisor never imports a GPU library: a hung kernel or a sticky CUDA error lives in
the child, and the child's whole process group can always be killed from here.
More in docs/architecture.md.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import json
import os
import re
import select
import subprocess
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import psutil

from .containment import CONTAINMENT
from .progress import POLL_S, LineScanner, Progress
from .proctree import (KILL_WAIT_S, PIDFDS, kill_group, kill_pids, pipe_holders, scan_for,
                             start_ticks, still_same)

TAIL_BYTES = 64 * 1024          # kept in memory per stream for classification
NOTABLE_KEEP = 10               # first and last notable lines kept per stream and keyword
COLLECTOR_BUDGET_S = 10.0       # all on-hang collectors together, per hang
MARK_PREFIX = "HZ_SUPERVISED_"
# What setpriv prints when it cannot exec the program (util-linux errexec: exit 126/127).
EXEC_FAILED = re.compile(r"setpriv: failed to execute ([^\n]*)")

__all__ = ["HangContext", "register_on_hang", "unregister_on_hang", "run_collectors", "set_collector_budget",
           "collector_budget", "find_marked", "Drain", "HangPolicy", "set_hang_policy", "hang_policy",
           "labelled_run", "is_registered",
           "Supervised", "kill_group", "scan_for"]


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
    # Set by run_collectors: when the shared budget ends (time.monotonic()), and the
    # outputs of the collectors that ran before this one (a later collector may cite them).
    deadline: float | None = None
    collected: dict[str, Any] = dataclasses.field(default_factory=dict)
    # What the run is (target, variant, expect, seq: `labelled_run` around it), and what the
    # hang policy decided for this hang (`HangPolicy.plan`; None without a policy).
    run: dict[str, Any] = dataclasses.field(default_factory=dict)
    plan: Any = None
    # Where the run's last progress event was, as its source said it (the stall verdict's
    # "last: ..."; '' when none said): a hang that gets no collector still has this place.
    last_progress: str = ""

    def remaining(self) -> float:
        """Seconds left of the collectors' budget (inf when no deadline was set)."""
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()


HangCollector = Callable[[HangContext], "dict[str, Any] | None"]
_collectors: list[tuple[int, HangCollector]] = []
_collectors_lock = threading.Lock()
_budget = {"s": COLLECTOR_BUDGET_S}


class HangPolicy(Protocol):
    """Decides, per hang, how long the collectors may take (a campaign's forensics share:
    hazards.engine.forensics.policy), and is told what they took."""

    def plan(self, ctx: HangContext) -> float: ...  # seconds for all collectors; 0: run none
    def spent(self, ctx: HangContext, seconds: float, results: dict[str, Any]) -> None: ...


_policy: dict[str, HangPolicy | None] = {"p": None}
# What the run in flight in this thread is: the loop sets it around each run.
_run_labels: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("hz_run_labels", default={})


def set_hang_policy(policy: HangPolicy | None) -> None:
    """Let `policy` decide every hang's collector budget from now on (None: the fixed hang budget)."""
    _policy["p"] = policy


def hang_policy() -> HangPolicy | None:
    return _policy["p"]


@contextlib.contextmanager
def labelled_run(**labels: Any) -> Iterator[None]:
    """Within (in this thread): a hang's `HangContext.run` is `labels` (target, variant, ...)."""
    token = _run_labels.set(dict(labels))
    try:
        yield
    finally:
        _run_labels.reset(token)


def is_registered(fn: HangCollector) -> bool:
    with _collectors_lock:
        return any(f == fn for _, f in _collectors)


def register_on_hang(fn: HangCollector, order: int = 0) -> None:
    """Call `fn(ctx)` on every hang, before the child is signalled. Idempotent.

    Collectors run in ascending `order`, then registration order. Passive readers (the
    tripwire's snapshots) keep the default 0; a collector that stops the process (a
    debugger attach) registers later so it cannot disturb what the readers see.
    """
    with _collectors_lock:
        if all(f != fn for _, f in _collectors):  # == : bound methods are made anew per access
            _collectors.append((order, fn))
            _collectors.sort(key=lambda item: item[0])  # stable: registration order within an order


def unregister_on_hang(fn: HangCollector) -> None:
    """Stop calling `fn` on hangs (no error if it was not registered)."""
    with _collectors_lock:
        _collectors[:] = [(o, f) for o, f in _collectors if f != fn]


def set_collector_budget(seconds: float) -> None:
    """Seconds all on-hang collectors together may take per hang (the hang budget)."""
    if not seconds > 0:
        raise ValueError(f"collector budget must be > 0 s, got {seconds!r}")
    _budget["s"] = float(seconds)


def collector_budget() -> float:
    """The current hang budget in seconds (default COLLECTOR_BUDGET_S)."""
    return _budget["s"]


def _jsonable(value: Any) -> Any:
    """Collector output as stored: JSON-safe (unknown objects become their str)."""
    return json.loads(json.dumps(value, default=str))


def find_marked(evidence: Any, marker: str) -> dict[str, Any] | None:
    """The first dict with `marker: 1` anywhere inside `evidence` (a collector's output,
    wherever a target or wrapper stored it)."""
    if isinstance(evidence, dict):
        if evidence.get(marker) == 1:
            return evidence
        values: Any = evidence.values()
    elif isinstance(evidence, list):
        values = evidence
    else:
        return None
    for v in values:
        found = find_marked(v, marker)
        if found is not None:
            return found
    return None


def run_collectors(ctx: HangContext, budget_s: float | None = None) -> dict[str, Any]:
    """Run every registered collector on `ctx`; return {name: output or {"error": ...}}.

    Each runs in its own thread against one shared time budget (default: what the hang
    policy plans for this hang, else the hang budget, `collector_budget()`), so a collector
    that raises or blocks is recorded as evidence and never takes the supervisor down.
    `ctx.deadline` tells collectors when the budget ends; `ctx.collected` holds the outputs
    of those that ran before. A planned budget of 0 runs none; the policy is told the
    seconds they took either way.
    """
    with _collectors_lock:
        fns = [fn for _, fn in _collectors]
    policy = _policy["p"] if budget_s is None else None
    t0 = time.monotonic()
    if policy is not None:
        try:
            budget_s = policy.plan(ctx)
            fns = fns if budget_s > 0 else []
        except Exception as exc:  # noqa: BLE001 - a policy must never stop the kill
            ctx.collected["hang_policy"] = {"error": f"{type(exc).__name__}: {exc}"}
            policy, budget_s = None, None
    budget_s = collector_budget() if budget_s is None else budget_s
    deadline = time.monotonic() + budget_s
    ctx.deadline = deadline
    results: dict[str, Any] = ctx.collected
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
    if policy is not None:
        try:
            policy.spent(ctx, time.monotonic() - t0, results)
        except Exception as exc:  # noqa: BLE001
            results["hang_policy"] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


class Drain(threading.Thread):
    """Reads one pipe to EOF: a bounded tail, an optional full log, and notable lines.

    Notable lines (fault signatures, result lines, tracebacks: `notable_re`, an object
    with `hits`, `window` and `max_after` such as classify.NOTABLE_RE) are kept even when
    they scroll out of the tail: the first and the last `NOTABLE_KEEP` of each kind. Every
    byte is scanned, in memory bounded whatever the output: a line is never buffered
    whole, only the window around a keyword (a carriage return ends a line too, so a
    progress bar is many short lines, not one endless one).
    """

    def __init__(self, fd: int, *, name: str, tail_bytes: int = TAIL_BYTES,
                 log_path: Path | None = None, notable_re: Any = None,
                 progress: Progress | None = None) -> None:
        super().__init__(name=f"hz-drain-{name}", daemon=True)
        self._progress = LineScanner(progress) if progress is not None else None
        self.fd = fd
        self.total = 0
        self._tail = bytearray()
        self._cap = tail_bytes
        self._log_path = log_path
        self._notable_re = notable_re
        # Scan state: `_buf` holds the stream from absolute offset `_buf_at`; keywords that
        # start before `_done` have been handled.
        self._buf = bytearray()
        self._buf_at = 0
        self._done = 0
        self.log_error: str | None = None
        self._notable: dict[str, tuple[list[str], collections.deque[str]]] = {}
        self._lock = threading.Lock()

    def run(self) -> None:
        log = self._open_log()
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                break
            if not data:
                break
            if log is not None:
                try:
                    log.write(data)
                except OSError as exc:  # a full disk must not stop the draining
                    self.log_error = f"{self._log_path}: {exc.strerror}"
                    log = self._close_log(log)
            self._scan(data, final=False)
            if self._progress is not None:
                self._progress.feed(data)
            with self._lock:
                self.total += len(data)
                self._tail += data
                if len(self._tail) > 2 * self._cap:
                    del self._tail[:-self._cap]
        self._scan(b"", final=True)
        self._close_log(log)

    def _open_log(self) -> Any:
        if self._log_path is None:
            return None
        try:
            return open(self._log_path, "wb")
        except OSError as exc:
            self.log_error = f"{self._log_path}: {exc.strerror}"
            return None

    def _close_log(self, log: Any) -> None:
        if log is not None:
            try:
                log.close()
            except OSError as exc:
                self.log_error = f"{self._log_path}: {exc.strerror}"

    def _scan(self, data: bytes, final: bool) -> None:
        """Handle every keyword whose line is complete, or whose window is (`max_after`
        bytes read past it); keep only what a later window can still need."""
        matcher = self._notable_re
        if matcher is None:
            return
        buf = self._buf
        buf += data
        if final:
            limit = len(buf)
        else:
            last_end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
            limit = max(last_end, len(buf) - matcher.max_after)
        lo = self._done - self._buf_at
        if limit > lo:
            kept = {}
            for keyword, at in matcher.hits(buf, lo, limit):
                start, line = matcher.window(buf, at, keyword, final=final)
                kept.setdefault(start, (keyword.decode(), line))
            if kept:
                self._keep([kept[s] for s in sorted(kept)])
            self._done = self._buf_at + limit
        drop = max(0, min(limit, len(buf)) - matcher.BEFORE)
        if drop:
            del buf[:drop]
            self._buf_at += drop

    def _keep(self, lines: list[tuple[str, str]]) -> None:
        with self._lock:
            for key, line in lines:
                # Per keyword, so a flood of one kind (result lines) cannot push out another.
                first, last = self._notable.setdefault(
                    key, ([], collections.deque(maxlen=NOTABLE_KEEP)))
                if len(first) < NOTABLE_KEEP:
                    first.append(line)
                elif not last or last[-1] != line:
                    last.append(line)

    def tail(self) -> bytes:
        """The last `tail_bytes` bytes read so far."""
        with self._lock:
            return bytes(self._tail[-self._cap:])

    def text(self) -> str:
        """What classification reads: the notable lines, then the tail, as text (carriage
        returns read as line ends; a tail cut mid-line starts at its next line)."""
        with self._lock:
            notable = [ln for first, last in self._notable.values() for ln in first + list(last)]
            tail = bytes(self._tail[-self._cap:])
            cut = self.total > len(tail)
        if cut:  # its first line is the end of one that began before the tail
            ends = [e for e in (tail.find(b"\n"), tail.find(b"\r")) if e >= 0]
            tail = tail[min(ends) + 1:] if ends else b""
        body = tail.decode("utf-8", "replace").replace("\r", "\n")
        return "\n".join(notable) + "\n" + body if notable else body


def _kill_forgotten(pgid: int, **kw: Any) -> None:
    """What a collected Supervised does (its owner forgot kill()): the tree dies, and the
    supervisor's record stops listing it."""
    if not kill_group(pgid, grace_s=0.0, **kw)["survivors"]:
        CONTAINMENT.ended(pgid)


class Supervised:
    """One child in its own session and process group, its output drained into tails.

    `line_stdout=True` leaves stdout to the caller (server protocol) as a non-blocking fd;
    otherwise stdout is drained like stderr. With `log_dir`, full logs are written there
    as stdout.log / stderr.log. `progress`, when given, hears the child's progress events
    (HZ_PROGRESS lines in its output; file sources the caller adds as pollers): `watch`
    then judges stalls. Raises OSError if the program cannot be started.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str | None = None,
                 target: str = "", stdin: bool = False, line_stdout: bool = False,
                 log_dir: Path | None = None, grace_s: float = 2.0,
                 notable_re: Any = None, sample_every_s: float = 0.25,
                 progress: Progress | None = None) -> None:
        self.argv = list(argv)
        self.progress = progress
        self.target = target
        self.grace_s = grace_s
        token = uuid.uuid4().hex
        self.mark = f"{MARK_PREFIX}{token}=".encode()
        self.env = dict(env)
        self.env[f"{MARK_PREFIX}{token}"] = "1"
        self.started_at = time.time()
        self._t0 = time.monotonic()
        # In its own session, with a parent-death signal, in a cgroup of its own where the
        # machine allows (stress/containment.py).
        self.proc, self.cgroup = CONTAINMENT.spawn(
            self.argv, mark=self.mark.decode(), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, cwd=cwd, env=self.env)
        self.pid = self.proc.pid
        self.pgid = self.pid  # setsid() made it the leader of a new session and group
        self.pidfd: int | None = os.pidfd_open(self.pid) if PIDFDS else None
        self._start_ticks = start_ticks(self.pid)
        # If the owner forgets kill() (an exception, interpreter exit), the tree still dies.
        self._finalizer = weakref.finalize(self, _kill_forgotten, self.pgid, mark=self.mark,
                                           since_ticks=self._start_ticks, leader=self.proc,
                                           cgroup=self.cgroup)
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
                                      log_path=log_dir / "stdout.log" if log_dir else None,
                                      progress=progress)
            self.stdout_drain.start()
        self.stderr_drain = Drain(self.proc.stderr.fileno(), name="stderr", notable_re=notable_re,
                                  log_path=log_dir / "stderr.log" if log_dir else None,
                                  progress=progress)
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

    def watch(self, deadline: float, stall_s: float | None = None) -> str:
        """Wait for the child's exit like `wait_exit`, judging progress meanwhile: "exited",
        "timeout" (monotonic `deadline` passed) or "stall" (`stall_s` seconds without a
        progress event after the first one; never before the first)."""
        progress = self.progress
        if progress is None or not stall_s:
            return "exited" if self.wait_exit(deadline) else "timeout"
        tick = POLL_S if progress.pollers else 0.05  # drains beat from their threads
        while True:
            if self.exit_status() is not None:
                return "exited"
            progress.poll()
            now = time.monotonic()
            quiet = progress.stalled_for(now)
            if quiet is not None and quiet >= stall_s:
                return "stall"
            if now >= deadline:
                return "timeout"
            self.maybe_sample()
            wake = min(deadline, self._t0 + self._next_sample, now + tick)
            if quiet is not None:
                wake = min(wake, now + stall_s - quiet)
            if self.pidfd is not None:
                select.select([self.pidfd], [], [], max(0.0, wake - now))
            else:
                time.sleep(min(max(0.0, wake - now), 0.001))

    # -- output ----------------------------------------------------------------------
    def stdout_text(self) -> str:
        return self.stdout_drain.text() if self.stdout_drain else ""

    def stderr_text(self) -> str:
        return self.stderr_drain.text()

    # -- ending ----------------------------------------------------------------------
    def hang(self, artifact_dir: Path | None = None, budget_s: float | None = None) -> dict[str, Any]:
        """Run the on-hang collectors on the live child (within `budget_s`, default the
        hang budget), then kill. Returns evidence."""
        last = self.progress.last_label() if self.progress is not None and self.progress.events else ""
        ctx = HangContext(pid=self.pid, pgid=self.pgid, argv=list(self.argv),
                          target=self.target, started_at=self.started_at,
                          artifact_dir=artifact_dir, env=dict(self.env), run=dict(_run_labels.get()),
                          last_progress=last)
        collected = run_collectors(ctx, budget_s)
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
        known = {pid for pid, p in self._tracked.items() if still_same(p)}
        evidence = kill_group(self.pgid, grace_s=self.grace_s, known_pids=known,
                              mark=self.mark, since_ticks=self._start_ticks, leader=self.proc,
                              cgroup=self.cgroup)
        self._kill_pipe_holders(evidence)
        self._finalizer.detach()
        self._close_fds()
        if self.cgroup:
            evidence["cgroup"] = self.cgroup
        if not evidence["survivors"]:
            CONTAINMENT.ended(self.pid)  # else the record keeps it for the guardian / next start
        self._killed = evidence
        return dict(evidence)

    def exec_failure(self) -> str | None:
        """Why the program itself could not be started (the exec in front of it, setpriv,
        said so and exited 126/127), or None: such a run never ran."""
        if self.proc.returncode not in (126, 127):
            return None
        head = self.stderr_drain.tail()[:1000].decode("utf-8", "replace")
        m = EXEC_FAILED.match(head)
        return m.group(1).strip() if m else None

    def _kill_pipe_holders(self, evidence: dict[str, Any]) -> None:
        """A drain that sees no EOF means a process still holds the child's pipe: one that
        left the group and dropped the marker before any sample. Find it by the pipe."""
        drains = [d for d in (self.stdout_drain, self.stderr_drain) if d is not None]
        for drain in drains:
            drain.join(timeout=0.1)
        open_pipes = {os.fstat(d.fd).st_ino for d in drains if d.is_alive()}
        holders = pipe_holders(open_pipes) if open_pipes else set()
        if holders:
            evidence["pipe_holders"] = sorted(holders)
            evidence["killed"] = sorted(set(evidence["killed"]) | holders)
            evidence["survivors"] += [{"pid": p} for p in kill_pids(holders, self.grace_s)]
        for drain in drains:
            drain.join(timeout=KILL_WAIT_S)

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
