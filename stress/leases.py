"""Exclusive GPU leases: one holder per GPU, released by the OS when the holder dies.

A lease is an `flock` on `<lock dir>/<gpu>.lock`. The lock dir is one per machine, shared
by every user and every working directory: `/tmp/gpu-hazards-leases` (DEFAULT_LOCK_DIR),
unless $HZ_LEASE_DIR or an explicit `lock_dir` names another. The kernel drops an flock
when the last file descriptor closes, so a SIGKILLed holder never leaves a stale lease
behind. The lock fd is not inherited by children (Python's default), so a child cannot keep
a lease alive after its supervisor is gone. The optional NVML exclusive-card check
(`exclusive=True`) catches compute processes that did not take a lease at all.
More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from .errors import UserError
from .outcome import HOST

DEFAULT_LOCK_DIR = Path("/tmp/gpu-hazards-leases")
DIR_MODE = 0o1777   # shared by all users, each removing only their own files (sticky)
FILE_MODE = 0o666   # lockable and rewritable by every user, whatever the creator's umask
LOG_NAME = "log.jsonl"
FAKE_ENV = "HZ_FAKE_GPUS"
LEASE_ENV = "HZ_LEASED"  # tokens ("<lock file name>:<holder pid>") of the leases a child runs under


class LeaseUnavailable(UserError):
    """The GPU asked for is held by someone else (or runs foreign compute processes)."""


def lock_dir_path(lock_dir: str | os.PathLike[str] | None = None) -> Path:
    """The lock folder: `lock_dir` if given, else $HZ_LEASE_DIR, else DEFAULT_LOCK_DIR."""
    if lock_dir:
        return Path(lock_dir)
    env = os.environ.get("HZ_LEASE_DIR")
    return Path(env) if env else DEFAULT_LOCK_DIR


def fake_gpus() -> list[str] | None:
    """The GPU list of $HZ_FAKE_GPUS (tests), or None when it is not set."""
    raw = os.environ.get(FAKE_ENV)
    if raw is None:
        return None
    return [e.strip() for e in raw.split(",") if e.strip()]


def _fake_visible(fakes: list[str]) -> list[str]:
    # The same rule CUDA applies to CUDA_VISIBLE_DEVICES, over the fake device list.
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return list(fakes)
    out = []
    for e in (x.strip() for x in cvd.split(",") if x.strip()):
        if e not in fakes:
            break
        out.append(e)
    return out


def lease_candidates() -> list[tuple[str, str | None]]:
    """(CUDA_VISIBLE_DEVICES entry, UUID or None) for every GPU this process may lease."""
    fakes = fake_gpus()
    if fakes is not None:  # a fake entry spelled as a UUID is its own UUID (NVML fakes key on it)
        return [(e, e if e.startswith("GPU-") else None) for e in _fake_visible(fakes)]
    from .gpus import uuid_of, visible_gpus

    return [(e, uuid_of(e)) for e in visible_gpus()]


def _lock_name(gpu: str, uuid: str | None) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", uuid or f"gpu{gpu}") + ".lock"


def _open_shared(path: Path, flags: int) -> tuple[int, bool]:
    """Open a file of the shared lease folder: (fd, writable). Never follows a symbolic
    link; a file it creates gets FILE_MODE whatever the umask; one another user left
    unwritable is opened read-only (an flock needs no write access). OSError otherwise,
    ELOOP for a planted link."""
    common = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a planted FIFO cannot block us
    try:
        fd = os.open(path, flags | common | os.O_CREAT | os.O_EXCL, FILE_MODE)
        created = True
    except FileExistsError:
        created = False
        try:
            fd = os.open(path, flags | common)
        except PermissionError:
            fd = os.open(path, (flags & ~(os.O_WRONLY | os.O_RDWR | os.O_APPEND)) | os.O_RDONLY | common)
            _check_regular(fd, path)
            return fd, False
    _check_regular(fd, path)
    if created:
        try:
            os.fchmod(fd, FILE_MODE)
        except OSError:
            pass
    return fd, True


def _check_regular(fd: int, path: Path) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")


def _log(lock_dir: Path, event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": time.time(), **fields}, sort_keys=True) + "\n"
    # O_APPEND writes of one short line land whole even with several writers.
    fd, writable = _open_shared(lock_dir / LOG_NAME, os.O_WRONLY | os.O_APPEND)
    try:
        if writable:
            os.write(fd, line.encode())
    finally:
        os.close(fd)


@dataclasses.dataclass
class GpuLease:
    """An exclusive hold on one GPU. Release it (or let the process die) to give it back."""

    gpu: str
    uuid: str | None
    holder: str
    lock_path: Path
    pid: int
    host: str
    acquired_at: float
    _fd: int | None = dataclasses.field(default=None, repr=False)
    inherited_from: int | None = None  # pid of the ancestor whose lease this runs under

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def is_gpu(self) -> bool:
        """False for the no-GPU pseudo-lease."""
        return True

    @property
    def visible_devices(self) -> str:
        """The CUDA_VISIBLE_DEVICES value a child of this lease gets."""
        return self.uuid or self.gpu

    @property
    def token(self) -> str:
        """What names this lease to the children it runs (`LEASE_ENV`): an inherited lease
        passes its holder's token on."""
        return f"{self.lock_path.name}:{self.inherited_from or self.pid}"

    def env(self) -> dict[str, str]:
        """Environment additions for children that run on this GPU."""
        return {"CUDA_VISIBLE_DEVICES": self.visible_devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                LEASE_ENV: self.token}

    def info(self) -> dict[str, Any]:
        """Who holds what, as JSON-ready fields (lease log, campaign spec)."""
        info = {"gpu": self.gpu, "uuid": self.uuid, "holder": self.holder, "pid": self.pid,
                "host": self.host, "acquired_at": self.acquired_at}
        if self.inherited_from is not None:
            info["inherited_from"] = self.inherited_from
        return info

    def release(self) -> None:
        """Give the GPU back (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # no stale holder info for the next reader
        except OSError:
            pass
        try:
            _log(self.lock_path.parent, "release", **self.info(), held_s=round(time.time() - self.acquired_at, 3))
        except OSError:
            pass
        os.close(fd)  # closing drops the flock

    def __enter__(self) -> "GpuLease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # a forgotten lease must not outlive its object
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass


NO_GPU = "none"


@dataclasses.dataclass
class NoGpuLease(GpuLease):
    """The pseudo-lease of a machine with no usable GPU: holds nothing, changes no
    environment variable (a child sees CUDA_VISIBLE_DEVICES as the caller set it)."""

    @property
    def is_gpu(self) -> bool:
        return False

    def env(self) -> dict[str, str]:
        return {}


def no_gpu_lease(holder: str) -> NoGpuLease:
    """A pseudo-lease for running without a GPU (see `NoGpuLease`)."""
    return NoGpuLease(NO_GPU, None, holder, Path(os.devnull), os.getpid(), HOST, time.time())


def _runs_under(path: Path, holder: dict[str, Any]) -> bool:
    """Whether our environment names the lease that holds `path` (we are its child)."""
    tokens = os.environ.get(LEASE_ENV, "").split(",")
    return holder.get("host") == HOST and f"{path.name}:{holder.get('pid')}" in tokens


def _prepare_dir(lock_dir: Path) -> None:
    """Create the lease folder (shared: DIR_MODE whatever the umask); refuse a symbolic
    link in its place or anything that is not a folder."""
    try:
        lock_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(lock_dir, DIR_MODE)
        except FileExistsError:
            pass
        else:
            os.chmod(lock_dir, DIR_MODE)  # the umask narrowed what mkdir made
        info = os.lstat(lock_dir)
    except OSError as e:
        raise UserError(f"cannot create lease folder {lock_dir}: {e.strerror or e}") from None
    if stat.S_ISLNK(info.st_mode):
        raise UserError(f"lease folder {lock_dir} is a symbolic link: refused (set HZ_LEASE_DIR to "
                        "the folder it points to if that is meant)")
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"cannot create lease folder {lock_dir}: it exists and is not a folder")
    # Whoever may delete a held lock file can hand the same GPU to two processes (the next
    # one locks a new file): the folder's owner always may, anyone with write access may
    # unless the sticky bit limits deletion to each file's owner.
    if info.st_uid not in (os.geteuid(), 0):
        raise UserError(f"lease folder {lock_dir} is owned by another user (uid {info.st_uid}), who could delete "
                        "a held lease and give the GPU to two processes: have root own it (chown root) or set "
                        "HZ_LEASE_DIR to a folder of yours")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise UserError(f"lease folder {lock_dir} is writable by others without the sticky bit (mode "
                        f"{stat.S_IMODE(info.st_mode):o}): anyone could delete a held lease; chmod +t it "
                        f"(mode {DIR_MODE:o}, like /tmp) or set HZ_LEASE_DIR to a folder of yours")


def _open_lock(path: Path) -> tuple[int, bool]:
    """(fd, writable) of a lock file; UserError naming the file when it cannot be used."""
    try:
        return _open_shared(path, os.O_RDWR)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(f"lease file {path} is a symbolic link: refused (a planted link would "
                            "make the lease write through it); remove it") from None
        raise UserError(f"cannot open lease file {path}: {e.strerror or e}") from None


def _try_lock(path: Path) -> tuple[int | None, dict[str, Any], bool]:
    """(fd, previous holder info, writable) when the lock was taken; (None, current holder,
    False) if busy."""
    fd, writable = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = _read_holder(fd)
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None, holder, False
        raise UserError(f"cannot lock lease file {path}: {e.strerror or e}") from None
    return fd, _read_holder(fd), writable


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0)
        return json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {}


def holder_text(info: dict[str, Any]) -> str:
    """'pid 12 on host (holder soak) since 12:00:01' from a lock file's holder info."""
    if not info:
        return "an unknown holder"
    since = time.strftime("%H:%M:%S", time.localtime(info.get("acquired_at", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} (holder {info.get('holder')!r}) since {since}"


def acquire(gpu: str, holder: str, *, uuid: str | None = None, lock_dir: str | os.PathLike[str] | None = None,
            wait_s: float = 0.0, exclusive: bool = False, poll_s: float = 0.2) -> GpuLease:
    """Lease one GPU (a CUDA_VISIBLE_DEVICES entry) for `holder`, waiting up to `wait_s`.

    Raises LeaseUnavailable naming the current holder when it stays busy, or, with
    `exclusive=True`, when NVML shows compute processes on the card that are not ours.
    """
    ldir = lock_dir_path(lock_dir)
    _prepare_dir(ldir)
    if uuid is None and fake_gpus() is None:
        from .gpus import uuid_of

        uuid = uuid_of(gpu)
    path = ldir / _lock_name(gpu, uuid)
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        fd, other, writable = _try_lock(path)
        if fd is not None:
            break
        if _runs_under(path, other):  # our parent's lease: run under it
            _log(ldir, "inherit", gpu=gpu, uuid=uuid, holder=holder, pid=os.getpid(), host=HOST,
                 held_by=other)
            return GpuLease(gpu, uuid, holder, path, os.getpid(), HOST, time.time(),
                            inherited_from=int(other["pid"]))
        if time.monotonic() >= deadline:
            _log(ldir, "refused", gpu=gpu, uuid=uuid, holder=holder, pid=os.getpid(), host=HOST,
                 reason="busy", held_by=other)
            raise LeaseUnavailable(f"GPU {gpu} is leased by {holder_text(other)}")
        time.sleep(poll_s)
    lease = GpuLease(gpu, uuid, holder, path, os.getpid(), HOST, time.time(), fd)
    try:
        return _claim(lease, other, ldir, exclusive, writable)
    except BaseException as e:
        # Whatever failed after the flock was taken (a full disk, an unwritable log), the
        # GPU must not stay leased by a lease object nobody holds.
        if lease._fd is not None:
            fd, lease._fd = lease._fd, None
            try:
                os.ftruncate(fd, 0)  # it never held the GPU: no holder info left behind
            except OSError:
                pass
            os.close(fd)
        if isinstance(e, OSError):
            raise UserError(f"cannot record the lease of GPU {gpu} in {ldir}: "
                            f"{e.strerror or e}") from None
        raise


def _claim(lease: GpuLease, other: dict[str, Any], ldir: Path, exclusive: bool, writable: bool) -> GpuLease:
    """Log a reclaim, run the exclusive check, write the holder info; the lease is held."""
    gpu, uuid, holder, fd = lease.gpu, lease.uuid, lease.holder, lease._fd
    assert fd is not None
    if other:  # the lock file still names a holder: it died without releasing
        _log(ldir, "reclaim", gpu=gpu, uuid=uuid, holder=holder, pid=lease.pid, host=HOST, previous=other)
    if exclusive:
        foreign = _foreign_pids(uuid)
        if foreign:
            if writable:
                os.ftruncate(fd, 0)
            os.close(fd)
            lease._fd = None
            _log(ldir, "refused", gpu=gpu, uuid=uuid, holder=holder, pid=lease.pid, host=HOST,
                 reason="foreign compute processes", foreign_pids=foreign)
            raise LeaseUnavailable(f"GPU {gpu} is not exclusive: foreign compute processes {foreign}")
    if writable:  # a read-only lock file (made so by another user) keeps its old line
        blob = json.dumps(lease.info()).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, blob, 0)
    _log(ldir, "acquire", **lease.info())
    return lease


def _foreign_pids(uuid: str | None) -> list[int]:
    if uuid is None:
        return []
    from .telemetry import compute_pids

    pids = compute_pids(uuid)
    if not pids:
        return []
    ours = {os.getpid()}
    try:
        import psutil

        ours |= {c.pid for c in psutil.Process().children(recursive=True)}
    except Exception:
        pass
    return sorted(p for p in pids if p not in ours)


def acquire_free(holder: str, *, lock_dir: str | os.PathLike[str] | None = None, max_gpus: int | None = None,
                 wait_s: float = 0.0, exclusive: bool = False) -> tuple[list[GpuLease], dict[str, str]]:
    """Lease every free GPU this process may use (at most `max_gpus`).

    Returns (leases, {gpu: why it was not leased}). When nothing is free at first, waits
    up to `wait_s` for at least one GPU.
    """
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        leases: list[GpuLease] = []
        skipped: dict[str, str] = {}
        for gpu, uuid in lease_candidates():
            if max_gpus is not None and len(leases) >= max_gpus:
                break
            try:
                leases.append(acquire(gpu, holder, uuid=uuid, lock_dir=lock_dir, exclusive=exclusive))
            except LeaseUnavailable as e:
                skipped[gpu] = str(e)
        if leases or not skipped or time.monotonic() >= deadline:
            return leases, skipped
        time.sleep(0.5)


def release_all(leases: list[GpuLease]) -> None:
    """Release every lease in the list (idempotent)."""
    for lease in leases:
        lease.release()


def read_lease_log(lock_dir: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Every event of the lease log, oldest first (unparseable lines are skipped)."""
    path = lock_dir_path(lock_dir) / LOG_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        text = f.read().decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def current_holders(lock_dir: str | os.PathLike[str] | None = None) -> dict[str, dict[str, Any]]:
    """{lock file name: holder info} for every lease held right now."""
    ldir = lock_dir_path(lock_dir)
    out: dict[str, dict[str, Any]] = {}
    if not ldir.is_dir():
        return out
    for path in sorted(ldir.glob("*.lock")):
        fd, info, _ = _try_lock(path)
        if fd is None:
            out[path.name] = info
        else:
            os.close(fd)
    return out
