"""A server target: a long-lived child speaking the JSON-lines protocol (docs/protocol.md).

One `run()` is one request. The worker is respawned after a hang, a fault (a sticky
device error poisons the context), a protocol error, or every `respawn_every` requests.
The hot path (write a request, wait for the reply) uses no threads and no polling sleeps:
one poll() on the server's stdout and its pidfd, against the request's deadline.
"""
from __future__ import annotations

import fcntl
import itertools
import os
import select
import struct
import termios
import time
from pathlib import Path
from typing import Any

from .. import protocol
from ..classify import (NOTABLE_RE, classify_exit, classify_reply, find_fault_signature,
                             reply_metrics, signal_name)
from ..errors import NotJudged, ProtocolError, UserError
from ..forensics.collector import hang_reason
from ..outcome import Outcome, RunResult
from ..progress import POLL_S, RunProgress, stall_reason
from ..targets.base import (Target, check_argv, check_cwd, check_env, check_grace,
                                 check_launches, check_params, check_stall, check_timeout, cut_short,
                                 default_name, prepare_artifact_dir, CUT_SHORT)
from ..targets.command import tail_text
from ..watchdog import Supervised

DEFAULT_HANDSHAKE_TIMEOUT_S = 60.0  # a torch import alone takes ~6 s
SAMPLE_EVERY_S = 1.0  # descendant sampling cadence: amortised to nothing per request


class _Worker:
    """One server process: its pipes, its read buffer, and how many requests it served."""

    def __init__(self, child: Supervised, sources: RunProgress) -> None:
        self.child = child
        self.sources = sources  # its progress file and tripwire: polled, removed with it
        self.progress = sources.progress
        self.age = 0
        self.startup_s: float | None = None  # spawn to handshake
        self.handshake: dict[str, Any] = {}
        self._buf = bytearray()
        self._eof = False
        self._out = child.stdout_fd
        self._poll = select.poll()
        self._poll.register(self._out, select.POLLIN)
        if child.pidfd is not None:
            self._poll.register(child.pidfd, select.POLLIN)

    def _read_available(self) -> None:
        # Bounded, so a server spewing bytes without a newline cannot keep us here.
        while not self._eof and len(self._buf) <= protocol.MAX_LINE_BYTES:
            try:
                data = os.read(self._out, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._eof = True
                self._poll.unregister(self._out)
                return
            self._buf += data

    def read_line(self, deadline: float) -> tuple[str, bytes]:
        """("line", line) | ("eof", partial bytes) | ("timeout", b"") | ("overlong", head)."""
        buf = self._buf
        while True:
            nl = buf.find(b"\n")
            if nl >= 0:
                line = bytes(buf[:nl + 1])
                del buf[:nl + 1]
                return "line", line
            if len(buf) > protocol.MAX_LINE_BYTES:
                return "overlong", bytes(buf[:200])
            if self._eof:
                return "eof", bytes(buf)
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", b""
            for fd, _ in self._poll.poll(left * 1000.0):
                if fd == self._out:
                    self._read_available()
                elif fd == self.child.pidfd:
                    # Exited: take what it wrote; a holder of its stdout must not stall us.
                    self._poll.unregister(fd)
                    self._read_available()
                    self._eof = True

    def read_reply(self, deadline: float, request_id: int, stall_s: float | None) -> tuple[str, bytes]:
        """`read_line` for the reply to `request_id`, taking its progress lines as progress
        events on the way (and ignoring a late one of an earlier request): adds ("stall",
        b"") when progress stopped for `stall_s` after the first event."""
        progress = self.progress
        tick = POLL_S if progress.pollers else 0.05  # the stderr drain beats from its thread
        while True:
            progress.poll()
            now = time.monotonic()
            quiet = progress.stalled_for(now)
            if stall_s and quiet is not None and quiet >= stall_s:
                return "stall", b""
            wake = min(deadline, now + tick) if (stall_s or progress.pollers) else deadline
            if stall_s and quiet is not None:
                wake = min(wake, now + stall_s - quiet)
            kind, line = self.read_line(wake)
            if kind == "timeout":
                if time.monotonic() >= deadline:
                    return kind, line
                continue
            if kind == "line":
                beat = protocol.progress_of(line)
                if beat is not None:
                    if beat[0] == request_id:
                        progress.beat(beat[1])
                    continue
            return kind, line

    def send(self, data: bytes, deadline: float) -> str:
        """Write a request: "ok", "broken" (the server is gone) or "timeout" (not reading)."""
        fd = self.child.stdin_fd
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                left = deadline - time.monotonic()
                writable = select.poll()
                writable.register(fd, select.POLLOUT)
                if left <= 0 or not writable.poll(left * 1000.0):
                    return "timeout"
            except (BrokenPipeError, OSError):
                return "broken"
        return "ok"

    def unread(self) -> int:
        """Bytes written to the server's stdin that it has not read (they stay in the pipe
        after it dies, so this tells whether a dead server ever read the last request)."""
        try:
            return struct.unpack("i", fcntl.ioctl(self.child.stdin_fd, termios.FIONREAD, b"\0" * 4))[0]
        except (OSError, TypeError):
            return 0

    def wait_exit(self, deadline: float) -> int | None:
        """The server's exit status once it exits (by `deadline`), else None."""
        return self.child.exit_status() if self.child.wait_exit(deadline) else None


class ServerTarget(Target):
    """A warm server process serving many runs; one run = one request/reply.

    `respawn_every` > 0 replaces the worker after that many requests. `grace_s` is the
    SIGTERM-to-SIGKILL grace (and how long a retiring worker may take to quit).
    `handshake_timeout_s` bounds the wait for the handshake line of each new worker.
    With `artifact_dir`, a hang/fault/error run leaves request.json, reply.raw (the raw
    line, possibly garbage) and server-stderr.log (the worker's stderr tail) there; clean
    and mismatch runs write nothing (a soak does thousands of requests a second).
    Not thread-safe: one run at a time per target (one target per GPU).
    A worker that fails its handshake is an `error` run (kind `handshake` or
    `handshake_timeout`); if the very first worker fails, `run()` and `start()` raise
    UserError instead, since the target itself is unusable.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None,
                 cwd: str | Path | None = None, name: str | None = None,
                 respawn_every: int = 0, grace_s: float = 2.0,
                 handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S) -> None:
        self.cwd = check_cwd(cwd)
        self.env = check_env(env)
        self.argv = check_argv(argv, self.cwd, self.env)
        self.name = name or default_name(self.argv)
        self.grace_s = check_grace(grace_s)
        self.handshake_timeout_s = check_timeout(handshake_timeout_s)
        if type(respawn_every) is not int or respawn_every < 0:
            raise UserError(f"respawn_every must be an integer >= 0, got {respawn_every!r}")
        self.respawn_every = respawn_every
        self._worker: _Worker | None = None
        self._ids = itertools.count(1)
        self._ever_started = False
        self.spawns = 0  # workers started so far (for tests and reports)

    # -- public state ----------------------------------------------------------------
    @property
    def worker_age(self) -> int:
        """Requests served by the current worker (0 when there is none)."""
        return self._worker.age if self._worker else 0

    @property
    def gpu_uuid(self) -> str | None:
        """The GPU the current worker reported in its handshake, if any."""
        return self._worker.handshake.get("gpu_uuid") if self._worker else None

    @property
    def pid(self) -> int | None:
        """The current worker's pid (None when there is none)."""
        return self._worker.child.pid if self._worker else None

    @property
    def handshake(self) -> dict[str, Any]:
        """The current worker's handshake object ({} when there is none)."""
        return dict(self._worker.handshake) if self._worker else {}

    # -- lifecycle -------------------------------------------------------------------
    def start(self, cutoff: float | None = None) -> None:
        """Start a worker now (if none runs); NotJudged (exit 3) if its handshake fails (or
        does not come before `cutoff`, time.monotonic()): its runs would all be errors."""
        failure = self._ensure_worker(cutoff)
        if failure:
            raise NotJudged(f"server target {self.name}: {failure[1]}")

    def close(self) -> None:
        """Ask the worker to quit, then make sure its whole process tree is gone."""
        self._retire(graceful=True)

    def _spawn(self, cutoff: float | None = None) -> tuple[str, str] | None:
        """Start a worker and read its handshake; (error_kind, message) on failure."""
        env = dict(self.env)
        sources = RunProgress(env)
        try:
            child = Supervised(self.argv, env=env, cwd=self.cwd, target=self.name,
                               stdin=True, line_stdout=True, grace_s=self.grace_s,
                               notable_re=NOTABLE_RE, sample_every_s=SAMPLE_EVERY_S,
                               progress=sources.progress)
        except OSError as exc:
            sources.close()
            raise UserError(f"cannot start {self.argv[0]}: {exc.strerror or exc}") from None
        self.spawns += 1
        try:
            worker = _Worker(child, sources)
            failure = self._handshake(worker, cutoff)
        except BaseException:
            child.kill()
            sources.close()
            raise
        if failure:
            child.kill()
            sources.close()
            return failure
        self._worker = worker
        self._ever_started = True
        worker.startup_s = child.elapsed()
        return None

    def _handshake(self, worker: _Worker, cutoff: float | None = None) -> tuple[str, str] | None:
        """Read banners and the handshake line; (error_kind, message) on failure (kind
        `cut_short` when `cutoff`, the campaign's budget end, comes first)."""
        deadline = time.monotonic() + self.handshake_timeout_s
        clipped = cutoff is not None and cutoff < deadline
        banners = 0
        while True:
            kind, line = worker.read_line(min(deadline, cutoff) if clipped else deadline)
            if kind == "timeout" and clipped:
                return (CUT_SHORT, "the server's start-up")
            if kind == "timeout":
                return ("handshake_timeout", f"handshake timeout: no hz_protocol line "
                        f"within {self.handshake_timeout_s:g}s")
            if kind == "overlong":
                return ("protocol", "protocol error: overlong handshake line")
            if kind == "eof" and line:
                return ("protocol", f"protocol error: truncated handshake line "
                        f"{protocol.shown(line)!r}")
            if kind == "eof":
                rc = worker.wait_exit(time.monotonic() + self.grace_s)
                worker.child.kill()  # reaps it and drains its stderr for the hint below
                return ("handshake", f"server {_exit_words(rc)} before its handshake"
                        f"{_stderr_hint(worker.child)}")
            if protocol.is_banner(line):
                banners += 1
                if banners > protocol.MAX_BANNER_LINES:
                    return ("protocol", f"protocol error: more than "
                            f"{protocol.MAX_BANNER_LINES} lines before the handshake")
                continue
            try:
                worker.handshake = protocol.validate_handshake(protocol.decode(line))
            except ProtocolError as exc:
                return ("protocol", f"protocol error in handshake: {exc}")
            return None

    def _ensure_worker(self, cutoff: float | None = None) -> tuple[str, str] | None:
        if self._worker and self.respawn_every and self._worker.age >= self.respawn_every:
            self._retire(graceful=True)
        if self._worker is None:
            return self._spawn(cutoff)
        return None

    def _retire(self, graceful: bool) -> dict[str, Any]:
        """End the current worker (asking it to quit first if `graceful`); kill evidence."""
        worker, self._worker = self._worker, None
        if worker is None:
            return {}
        child = worker.child
        if graceful and child.exit_status() is None:
            deadline = time.monotonic() + self.grace_s
            if worker.send(protocol.encode(protocol.quit_request(next(self._ids))),
                           deadline) == "ok":
                child.wait_exit(deadline)
        try:
            return child.kill()
        finally:
            worker.sources.close()

    # -- one run ---------------------------------------------------------------------
    def run(self, params: dict[str, Any] | None = None, *, timeout: float,
            launches: int | None = None, artifact_dir: Path | None = None,
            stall: float | None = None, cutoff: float | None = None) -> RunResult:
        """Send one request (`launches` defaults to 1) and judge the reply within `timeout`
        (or sooner, a hang, when its progress stops for `stall` seconds: docs/stall.md).
        At `cutoff` (time.monotonic(), the campaign's budget end) a request or a start-up
        still going is given up unjudged (`cut_short`; the worker is replaced)."""
        timeout = check_timeout(timeout)
        stall = check_stall(stall)
        params = check_params(params)
        launches = check_launches(launches) or 1
        artifacts = prepare_artifact_dir(artifact_dir)
        request_id = next(self._ids)
        try:
            request = protocol.encode(protocol.request(request_id, launches, params))
        except (TypeError, ValueError) as exc:
            raise UserError(f"params are not JSON-serialisable: {exc}") from None
        t_start, started_at = time.monotonic(), time.time()
        failure = self._ensure_worker(cutoff)
        if failure and failure[0] == CUT_SHORT:
            return cut_short(self.name, params, started_at, time.monotonic() - t_start, failure[1])
        if failure:
            if not self._ever_started:
                raise UserError(f"server target {self.name}: {failure[1]}")
            return self._result(Outcome.ERROR, failure[1], {"error_kind": failure[0]},
                                params, time.time(), 0.0, 0, artifacts)
        worker = self._worker
        assert worker is not None
        try:
            return self._exchange(worker, request, request_id, params, timeout, artifacts, stall, cutoff)
        except BaseException:
            if self._worker is worker:  # interrupted mid-request: leave nothing behind
                self._retire(graceful=False)
            raise

    def _exchange(self, worker: _Worker, request: bytes, request_id: int,
                  params: dict[str, Any], timeout: float, artifacts: Path | None,
                  stall: float | None = None, cutoff: float | None = None) -> RunResult:
        worker.child.maybe_sample()
        progress = worker.progress
        progress.restart()
        age = worker.age
        worker.age += 1
        started_at = time.time()
        t0 = time.monotonic()
        clipped = cutoff is not None and cutoff < t0 + timeout
        deadline = min(t0 + timeout, cutoff) if clipped else t0 + timeout
        # One waitid() per request: a server that died after its last reply is reported
        # as such, not as a death during this request.
        when = "between requests" if worker.child.exit_status() is not None else "mid-request"
        sent = worker.send(request, deadline) if when == "mid-request" else "broken"
        if sent == "ok":
            kind, data = worker.read_reply(deadline, request_id, stall)
        else:
            kind, data = ("timeout", b"") if sent == "timeout" else ("eof", b"")
        if kind == "eof" and (sent == "broken" or worker.unread() >= len(request)):
            # It was gone, or going, before it read this request: a server that exits
            # right after its reply races the next request, which must not count as a
            # death during that request.
            when = "between requests"
        duration = time.monotonic() - t0
        if kind == "timeout" and clipped:
            self._retire(graceful=False)  # mid-request: its next request needs a fresh one
            return cut_short(self.name, params, started_at, duration)
        if kind == "line":
            progress.finish()
        evidence: dict[str, Any] = {"request_id": request_id, "server_pid": worker.child.pid}
        if age == 0 and worker.startup_s is not None:
            evidence["startup_s"] = round(worker.startup_s, 4)  # calibrates handshake timeouts
        if progress.events:
            evidence["progress"] = progress.summary()
        metrics: dict[str, Any] = {}
        gpu_uuid = worker.handshake.get("gpu_uuid")
        if kind == "line":
            try:
                reply = protocol.validate_reply(protocol.decode(data), request_id)
            except ProtocolError as exc:
                outcome, reason = Outcome.ERROR, f"protocol error: {exc}"
                evidence.update(error_kind="protocol", line=protocol.shown(data))
            else:
                outcome, reason, judged = classify_reply(reply)
                evidence.update(judged)
                metrics = reply_metrics(reply)
        elif kind == "overlong":
            outcome, reason = Outcome.ERROR, (f"protocol error: line longer than "
                                              f"{protocol.MAX_LINE_BYTES} bytes")
            evidence.update(error_kind="protocol", line=protocol.shown(data))
        elif kind in ("timeout", "stall"):
            if kind == "stall":
                outcome, reason = Outcome.HANG, stall_reason(progress.stalled_for() or 0.0, progress.last_label())
                evidence["stall_s"] = stall
            else:
                outcome, reason = Outcome.HANG, f"no reply within {timeout:g}s"
            evidence["error_kind"] = kind
            self._worker = None
            try:
                evidence.update(worker.child.hang(artifacts))
            finally:
                worker.sources.close()
        else:
            outcome, reason = self._judge_death(worker, data, deadline, timeout, evidence,
                                                artifacts, when)
        # A fault poisons the device context; garbage means we lost sync: start afresh.
        if self._worker is worker and (outcome is Outcome.FAULT
                                       or evidence.get("error_kind") == "protocol"):
            evidence.update(self._retire(graceful=False))
        if outcome is not Outcome.CLEAN and outcome is not Outcome.MISMATCH:
            evidence["stderr_tail"] = tail_text(worker.child.stderr_drain.tail())
            if artifacts is not None:
                _write_artifacts(artifacts, request, data, worker.child)
        return self._result(outcome, reason, evidence, params, started_at, duration, age,
                            artifacts, metrics, gpu_uuid)

    def _judge_death(self, worker: _Worker, partial: bytes, deadline: float, timeout: float,
                     evidence: dict[str, Any], artifacts: Path | None,
                     when: str) -> tuple[Outcome, str]:
        """The server's stdout ended (`when`: mid-request or between requests): a fault,
        or a protocol error (truncated line) or a hang (stdout closed, no exit)."""
        # An exiting process closes its stdout a moment before it can be reaped.
        settle = time.monotonic() + min(self.grace_s, 0.5)
        if worker.wait_exit(max(deadline, settle)) is None:  # closed stdout, kept running
            self._worker = None
            try:
                evidence.update(worker.child.hang(artifacts))
            finally:
                worker.sources.close()
            evidence["error_kind"] = "timeout"
            return Outcome.HANG, f"closed its stdout and no exit within {timeout:g}s"
        evidence.update(self._retire(graceful=False))  # reaps it and drains its stderr
        rc = worker.child.proc.returncode
        outcome, reason, judged = classify_exit(rc, "", worker.child.stderr_text())
        judged.pop("exit_code", None)
        evidence["exit_code"] = rc
        explained = outcome in (Outcome.FAULT, Outcome.ERROR) and any(
            k in judged for k in ("signal", "fault_signature", "infra_signature",
                                  "python_exception"))
        if partial and not explained:
            evidence.update(error_kind="protocol", line=protocol.shown(partial))
            return Outcome.ERROR, (f"protocol error: truncated line (EOF without newline): "
                                   f"{protocol.shown(partial)!r}")
        if partial:
            evidence["line"] = protocol.shown(partial)
        if explained:
            evidence.update(judged)
            return outcome, f"server died {when}: {reason}"
        if rc == 0:
            # It quit on its own (exit 0 says "I chose to stop", never "the kernel failed"):
            # nothing about the kernel was shown; the next request gets a fresh server.
            evidence["error_kind"] = "server_exited"
            if when == "between requests":
                return Outcome.ERROR, "server exited with code 0 between requests (this request never ran)"
            return Outcome.ERROR, "server exited with code 0 without replying to this request"
        evidence["error_kind"] = f"exit_{rc}"
        return Outcome.FAULT, f"server died {when}: {_exit_words(rc)}"

    def _result(self, outcome: Outcome, reason: str, evidence: dict[str, Any],
                params: dict[str, Any], started_at: float, duration: float, age: int,
                artifacts: Path | None, metrics: dict[str, Any] | None = None,
                gpu_uuid: str | None = None) -> RunResult:
        if outcome is Outcome.HANG:
            reason = hang_reason(reason, evidence)  # where it is stuck, when a collector saw it
        return RunResult(
            outcome=outcome, reason=reason, target=self.name,
            variant=str(params.get("variant", "")), params=params, evidence=evidence,
            metrics=metrics or {}, started_at=started_at, duration_s=duration,
            gpu_uuid=gpu_uuid, worker_age=age,
            artifact_dir=str(artifacts) if artifacts else None,
            error_kind=evidence.get("error_kind"))


def _exit_words(rc: int | None) -> str:
    if rc is None:
        return "closed its stdout"
    return f"was killed by {signal_name(-rc)}" if rc < 0 else f"exited with code {rc}"


def _stderr_hint(child: Supervised) -> str:
    """": <why>" from the server's stderr: a fault signature, else its last line."""
    text = child.stderr_text()
    sig = find_fault_signature(text)
    if sig:
        return f": {sig[1]}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f": {lines[-1][:200]}" if lines else ""


def _write_artifacts(folder: Path, request: bytes, reply: bytes, child: Supervised) -> None:
    """What a failed request leaves for a human: the request, the raw reply, stderr's tail."""
    (folder / "request.json").write_bytes(request)
    (folder / "reply.raw").write_bytes(reply)
    (folder / "server-stderr.log").write_bytes(child.stderr_drain.tail())
