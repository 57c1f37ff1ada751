"""Progress of a supervised run: the events that say it is still moving, and the stall clock.

A run whose target shows progress is a `hang` as soon as progress stops for its stall
window, long before its timeout (which stays as the backstop). A run that never shows
progress has only the timeout. More in docs/stall.md.
"""
from __future__ import annotations

import math
import os
import struct
import tempfile
import threading
import time
from typing import Any, Callable

TAG = b"HZ_PROGRESS"
ENV_FILE = "HZ_PROGRESS_FILE"
LABEL_CHARS = 160           # of a label, kept for the reason
POLL_S = 0.02               # how often files are polled while a run has file sources
BUCKETS_PER_OCTAVE = 4      # gap histogram: bucket k holds gaps in (2^((k-1)/4), 2^(k/4)] ms
_LINE_TAGS = (b"\n" + TAG, b"\r" + TAG)
SNAPSHOTS_AT = 32            # tripwire header: the snapshot counter's offset (8 bytes; docs/tripwire.md),
LAUNCH_NS_END = 56           # then the writer's pid and the launch's start time


def gap_bucket(gap_s: float) -> int:
    """The histogram bucket of a gap: the smallest k with gap <= 1 ms * 2^(k/4) (k >= 0)."""
    ms = gap_s * 1e3
    if ms <= 1.0:
        return 0
    return max(0, math.ceil(math.log2(ms) * BUCKETS_PER_OCTAVE - 1e-9))


def bucket_upper_s(k: int) -> float:
    """The upper edge of gap bucket `k` in seconds."""
    return 1e-3 * 2.0 ** (k / BUCKETS_PER_OCTAVE)


class Progress:
    """The progress events of one run (thread-safe: drains and pollers beat from threads).

    `beat(label)` records an event; `stalled_for(now)` is the time since the last one (None
    before the first). `gaps` is the histogram {bucket: count} of the gaps between events.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.label = ""
        self.max_gap_s = 0.0
        self.gaps: dict[int, int] = {}
        self.pollers: list[Callable[[], None]] = []
        self._label_fn: Callable[[], str] | None = None
        self._where_fn: Callable[[], str] | None = None  # the tripwire's: names the kernel's place

    def restart(self) -> None:
        """Forget every event (a server's next request starts its own count)."""
        with self._lock:
            self.events, self.first_at, self.last_at, self.label, self._label_fn = 0, None, None, "", None
            self._where_fn = None
            self.max_gap_s, self.gaps = 0.0, {}

    def beat(self, label: str | None = None, at: float | None = None,
             label_fn: Callable[[], str] | None = None, where: bool = False) -> None:
        """One progress event now (or at `at`, time.monotonic()); `label` says where it was
        (`label_fn`, when given, makes it only if a verdict needs it). `where`: `label_fn`
        names the kernel's own place (the tripwire's layer and phase): the last such one is
        the verdict's label even when another source beat after it (a heartbeat says less)."""
        now = time.monotonic() if at is None else at
        with self._lock:
            if self.last_at is not None:
                self._gap(max(0.0, now - self.last_at))
            else:
                self.first_at = now
            self.last_at = now
            self.events += 1
            if label is not None:
                self.label, self._label_fn = label[:LABEL_CHARS], None
            elif label_fn is not None:
                self._label_fn = label_fn
            if where and label_fn is not None:
                self._where_fn = label_fn

    def _gap(self, gap: float) -> None:
        k = gap_bucket(gap)
        self.gaps[k] = self.gaps.get(k, 0) + 1
        self.max_gap_s = max(self.max_gap_s, gap)

    def stalled_for(self, now: float | None = None) -> float | None:
        """Seconds since the last event (None: no event yet, so no stall clock)."""
        with self._lock:
            if self.last_at is None:
                return None
            return (time.monotonic() if now is None else now) - self.last_at

    def last_label(self) -> str:
        """Where the last event was, as its source said it ('' when nobody said); the
        tripwire's place when it beat in this run."""
        with self._lock:
            where = self._where_fn
        if where is not None:
            try:
                text = where()[:LABEL_CHARS]
            except Exception:  # a label must never cost the verdict: fall back to the last one
                text = ""
            if text:
                return text
        with self._lock:
            fn = self._label_fn
        if fn is not None:
            try:
                label = fn()[:LABEL_CHARS]
            except Exception as exc:  # a label must never cost the verdict
                label = f"(label failed: {type(exc).__name__})"
            with self._lock:
                if self._label_fn is fn:
                    self.label, self._label_fn = label, None
        with self._lock:
            return self.label

    def poll(self) -> None:
        """Poll the file sources once (the watchdog calls this every POLL_S)."""
        for poll in self.pollers:
            poll()

    def finish(self, at: float | None = None) -> None:
        """The run ended (exited or replied): the gap from the last event counts too, since
        the stall window governs it as well."""
        with self._lock:
            if self.last_at is not None:
                self._gap(max(0.0, (time.monotonic() if at is None else at) - self.last_at))
                self.last_at = None

    def summary(self) -> dict[str, Any]:
        """What a run's evidence keeps: event count, largest gap, the gap histogram."""
        with self._lock:
            return {"events": self.events, "max_gap_s": round(self.max_gap_s, 6),
                    "gaps": {str(k): n for k, n in sorted(self.gaps.items())}}


class LineScanner:
    """Finds `HZ_PROGRESS` at the start of a line in a byte stream read in chunks (a tag
    split across two reads is found once), and beats `progress` with the line's rest."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._carry = b"\n"  # the stream's start counts as a line start

    def feed(self, data: bytes) -> None:
        buf = self._carry + data
        last = -1
        for tag in _LINE_TAGS:
            last = max(last, buf.rfind(tag))
        if last >= 0:
            start = last + 1 + len(TAG)
            ends = [e for e in (buf.find(b"\n", start), buf.find(b"\r", start)) if e >= 0]
            label = buf[start:min(ends) if ends else start + LABEL_CHARS].decode("utf-8", "replace").strip()
            self.progress.beat(label)
        self._carry = buf[-len(TAG):]


def file_poller(progress: Progress, path: str) -> Callable[[], None]:
    """A poller that beats when the file's size or modification time changes; the label is
    its last line (for small files)."""
    state: dict[str, Any] = {"key": None}

    def label() -> str:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 512))
                tail = f.read()
        except OSError:
            return ""
        lines = [ln for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""

    def poll() -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        key = (st.st_size, st.st_mtime_ns)
        if state["key"] is None:
            state["key"] = key  # how it was when the run started: not an event
            return
        if key != state["key"]:
            state["key"] = key
            progress.beat(label_fn=label)

    poll()
    return poll


def tripwire_poller(progress: Progress, path: str, names: Any = None) -> Callable[[], None]:
    """A poller that beats when the tripwire file's launch generation, a worker's position
    or a barrier state changes (not its spin counts: a deadlocked kernel keeps spinning).
    The label names the least advanced unfinished worker's layer and phase."""
    from .tripwire.layout import HEADER_BYTES, SLOT_WORDS, decode

    state: dict[str, Any] = {"key": None, "raw": b""}

    def key_of(raw: bytes) -> tuple:
        if len(raw) < HEADER_BYTES:
            return (len(raw),)
        n = (len(raw) - HEADER_BYTES) // (SLOT_WORDS * 8)
        words = struct.unpack_from(f"<{n * SLOT_WORDS}Q", raw, HEADER_BYTES)
        # position word, and the barrier word without its spin count (low 32 bits)
        moving = tuple(w for s in range(n) for w in (words[s * SLOT_WORDS], words[s * SLOT_WORDS + 1] >> 32))
        # the header through the launch generation, and the writer's pid and launch time (a
        # respawned server that hangs where the last one did writes the same positions), but
        # not the snapshot counter (a snapshot thread keeps counting while the kernel hangs)
        return (raw[:SNAPSHOTS_AT], raw[SNAPSHOTS_AT + 8:LAUNCH_NS_END], moving)

    def label() -> str:
        snap = decode(state["raw"], path)
        return tripwire_label(snap, names)

    def poll() -> None:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            return
        key = key_of(raw)
        if state["key"] is None:
            state["key"], state["raw"] = key, raw
            return
        if key != state["key"]:
            state["key"], state["raw"] = key, raw
            progress.beat(label_fn=label, where=True)

    poll()
    return poll


def tripwire_label(snap: Any, names: Any = None) -> str:
    """'launch 12, layer 3, phase ATTN, barrier ATTN_RELEASE' for the least advanced worker
    of the current launch that has not finished ('' when the file says nothing)."""
    from .tripwire.names import Names

    names = names or Names()
    if snap.header is None:
        return ""
    live = [s for s in snap.slots if s.current and not s.done]
    parts = [f"launch {snap.header.generation}"]
    if live:
        s = min(live, key=lambda s: (s.layer, s.phase, not s.waiting, s.tile))  # a waiter names its barrier
        parts += [f"layer {s.layer}", f"phase {names.phase(s.phase)}"]
        if s.waiting:
            parts.append(f"barrier {names.barrier(s.barrier)}")
    return ", ".join(parts)


class RunProgress:
    """The progress sources of one run (or of one server process), as a context manager
    around it: makes its `HZ_PROGRESS_FILE` (put into `env`), and polls it and its tripwire
    file (when `env` names one). The progress file is removed on exit (`close`)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.progress = Progress()
        self.path: str | None = None
        from .containment import CONTAINMENT

        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        try:
            fd, self.path = tempfile.mkstemp(prefix="hz-progress-", dir=folder)
            os.close(fd)
        except OSError:
            self.path = None  # no file source then; the lines and the tripwire still count
        if self.path is not None:
            CONTAINMENT.track_file(self.path)
            env[ENV_FILE] = self.path
            self.progress.pollers.append(file_poller(self.progress, self.path))
        from .tripwire.session import ENV_PATH, names_for

        tripwire = env.get(ENV_PATH)
        if tripwire:
            self.progress.pollers.append(tripwire_poller(self.progress, tripwire, names_for(tripwire)))

    def __enter__(self) -> "RunProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the progress file (idempotent)."""
        if self.path is not None:
            from .containment import CONTAINMENT

            try:
                os.unlink(self.path)
            except OSError:
                pass
            CONTAINMENT.track_file(self.path, live=False)
            self.path = None


def stall_reason(quiet_s: float, label: str) -> str:
    """The reason of a stall verdict: 'no progress for 1.2 s (last: layer 3, phase X)'."""
    return f"no progress for {quiet_s:.1f} s" + (f" (last: {label})" if label else "")


__all__ = ["Progress", "RunProgress", "LineScanner", "file_poller", "tripwire_poller", "tripwire_label", "stall_reason",
           "gap_bucket", "bucket_upper_s", "TAG", "ENV_FILE", "POLL_S"]
