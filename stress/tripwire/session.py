"""The supervisor's side of a tripwire: the private file and the on-hang collector.

The target wrapper that adds post-mortem diagnoses, and the lifecycle of a file, are in
`hazards.engine.targets.tripwire`. The collector is registered with the watchdog
(`install_hang_collector`) and acts on any hung child whose environment names a tripwire file,
so server targets get it too.
"""
from __future__ import annotations

import atexit
import json
import os
import secrets
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..containment import CONTAINMENT
from ..tripwire.analysis import Diagnosis, analyze
from ..tripwire.layout import Snapshot, decode
from ..tripwire.names import Names

ENV_PATH = "HZ_TRIPWIRE_PATH"
SHM_DIR = "/dev/shm"
SECOND_SNAPSHOT_S = 1.0  # between the two live snapshots: long enough for ~thousands of polls
PREFIX = "hz-tw-"
MARKER = "hz_tripwire"  # key that identifies this collector's output inside evidence
ONE_READ = "hang, one read"  # the `when` of `read_once_on_hang`'s diagnosis

_live_files: set[str] = set()
_names_by_path: dict[str, Names] = {}
_lock = threading.Lock()


def _remove_leftovers() -> None:
    for p in list(_live_files):
        try:
            os.unlink(p)
        except OSError:
            pass


atexit.register(_remove_leftovers)


class TripwireFile:
    """A private, uniquely named file for one target's breadcrumbs (mode 0600, O_EXCL).

    Placed in /dev/shm (cudaHostRegister accepts tmpfs pages; a disk file is refused and
    the program falls back to its snapshot thread). Removed by `close()`, by the context
    manager, and at interpreter exit as a last resort.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, prefix: str = PREFIX) -> None:
        d = Path(directory) if directory else Path(SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir())
        for _ in range(16):
            path = d / f"{prefix}{os.getpid()}-{secrets.token_hex(6)}"
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue
            os.close(fd)
            break
        else:  # pragma: no cover - 16 collisions of 48 random bits
            raise OSError(f"could not create a unique tripwire file in {d}")
        self.path = path
        with _lock:
            _live_files.add(str(path))
        CONTAINMENT.track_file(str(path))  # removed by the guardian or the next start if we die

    def env(self) -> dict[str, str]:
        """The environment entry the child needs."""
        return {ENV_PATH: str(self.path)}

    def reset(self) -> None:
        """Empty the file, so a run that never opens it reads as 'never opened'."""
        try:
            os.truncate(self.path, 0)
        except FileNotFoundError:
            pass

    def read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return b""

    def snapshot(self) -> Snapshot:
        return decode(self.read(), str(self.path))

    def keep(self, dest: Path, name: str = "tripwire.bin") -> Path | None:
        """Copy the current contents into `dest` (an artifact); None when empty."""
        data = self.read()
        if not data:
            return None
        dest.mkdir(parents=True, exist_ok=True)
        out = dest / name
        out.write_bytes(data)
        return out

    def close(self) -> None:
        """Remove the file (idempotent)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        with _lock:
            _live_files.discard(str(self.path))
            _names_by_path.pop(str(self.path), None)
        CONTAINMENT.track_file(str(self.path), live=False)

    def __enter__(self) -> "TripwireFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def register_names(path: str | os.PathLike[str], names: Names) -> None:
    """Names the collector uses for the file at `path`."""
    with _lock:
        _names_by_path[str(path)] = names


def names_for(path: str | os.PathLike[str]) -> Names | None:
    """The names registered for the file at `path` (None when none were)."""
    with _lock:
        return _names_by_path.get(str(path))


def write_artifacts(dest: Path | None, stem: str, diag: Diagnosis,
                    images: list[tuple[bytes, Snapshot]]) -> list[str]:
    """tripwire-<stem>.json (diagnosis + decoded snapshots), .txt, and the raw images."""
    if dest is None:
        return []
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    j = dest / f"tripwire-{stem}.json"
    j.write_text(json.dumps({"diagnosis": diag.to_json(), "snapshots": [s.to_json() for _, s in images]},
                            indent=1, default=str))
    t = dest / f"tripwire-{stem}.txt"
    t.write_text(diag.to_text())
    written += [str(j), str(t)]
    for i, (raw, _) in enumerate(images, 1):
        if raw:
            b = dest / f"tripwire-{stem}-{i}.bin"
            b.write_bytes(raw)
            written.append(str(b))
    return written


def diagnosis_evidence(diag: Diagnosis, artifacts: list[str], when: str) -> dict[str, Any]:
    """A diagnosis as run evidence, marked so `find_tripwire_evidence` finds it anywhere."""
    return {MARKER: 1, "when": when, "verdict": diag.verdict, "sentence": diag.sentence,
            "counts": diag.counts, "stragglers": diag.stragglers[:64], "skewed": diag.skewed[:16],
            "never_started": diag.never_started[:64], "notes": diag.notes, "artifacts": artifacts}


def collect_on_hang(ctx: Any) -> dict[str, Any] | None:
    """Watchdog collector: two live snapshots SECOND_SNAPSHOT_S apart, then a diagnosis.

    `ctx` is a `hazards.engine.watchdog.HangContext`; returns None when the child has no tripwire.
    """
    path = (ctx.env or {}).get(ENV_PATH)
    if not path:
        return None
    first = _image(path)
    # The gap fits the hang's collector budget (a summary under a campaign's forensics cap may
    # have less than a second; the other half is for the diagnosis and the later collectors).
    remaining = ctx.remaining() if hasattr(ctx, "remaining") else float("inf")
    time.sleep(min(SECOND_SNAPSHOT_S, max(0.05, (remaining - 0.1) / 2)))
    return _diagnosis_on_hang(ctx, path, [first, _image(path)], "hang")


def read_once_on_hang(ctx: Any) -> dict[str, Any] | None:
    """One read of a hung child's tripwire file and its diagnosis, for a hang that the forensics
    policy gives no collector. Not a collection: it stops nothing and waits for nothing (no
    second snapshot, so no spinning/frozen counts), and reads one file of a few to ~150 KB in
    /dev/shm, as the post-mortem read of a fault does. None when the child has no tripwire."""
    path = (ctx.env or {}).get(ENV_PATH)
    return _diagnosis_on_hang(ctx, path, [_image(path)], ONE_READ) if path else None


def _diagnosis_on_hang(ctx: Any, path: str, images: list[tuple[bytes, Snapshot]], when: str) -> dict[str, Any]:
    """The diagnosis of a hung child's snapshots (live: taken before the kill), its artifacts
    tripwire-hang.*, as evidence."""
    with _lock:
        names = _names_by_path.get(path)
    diag = analyze(images[0][1], images[1][1] if len(images) > 1 else None, names, live=True)
    return diagnosis_evidence(diag, write_artifacts(ctx.artifact_dir, "hang", diag, images), when)


def _image(path: str) -> tuple[bytes, Snapshot]:
    """The file's bytes now, decoded now (the snapshot's time is the read's)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        raw = b""
    return raw, decode(raw, path)


def install_hang_collector() -> None:
    """Register `collect_on_hang` with the watchdog (idempotent)."""
    from ..watchdog import register_on_hang

    register_on_hang(collect_on_hang)


def uninstall_hang_collector() -> None:
    from ..watchdog import unregister_on_hang

    unregister_on_hang(collect_on_hang)


def find_tripwire_evidence(evidence: Any) -> dict[str, Any] | None:
    """This collector's output wherever the target stored it inside `evidence`."""
    from ..watchdog import find_marked

    return find_marked(evidence, MARKER)
