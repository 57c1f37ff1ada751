"""What a supervisor leaves behind if it dies, and who cleans it up.

Every supervisor process keeps a *record* of what it started and must end: its children
(pid, process group, start time, environment marker, cgroup), its cgroup folder, its
tripwire files in /dev/shm and its running campaigns (store path, id). The record is a
JSON-lines file, `<runtime dir>/supervisors/<pid>-<start ticks>.jsonl` (runtime dir:
$HZ_RUNTIME_DIR, else /tmp/gpu-hazards-<uid>, mode 0700), appended as things start and
end; the supervisor holds an exclusive flock on it for its whole life. The kernel drops
that lock however the supervisor dies, so "the lock can be taken" means "its supervisor is
gone": no pid is trusted, none can be recycled into a wrong answer. More in docs/architecture.md.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .proctree import cgroup_pids, kill_cgroup, remove_cgroup, scan_for, start_ticks

RECORD_DIR = "supervisors"
STALE_S = 30 * 86400       # a cleaned record whose campaigns' stores were never reopened
WAIT_FOR_CLEANER_S = 10.0  # a record locked by a cleaner (its supervisor is dead)
COMPACT_BYTES = 1 << 16    # a record this large, and mostly ended entries, is rewritten


def runtime_dir() -> Path:
    """Where this user's supervisor records live: $HZ_RUNTIME_DIR, else /tmp/gpu-hazards-<uid>."""
    env = os.environ.get("HZ_RUNTIME_DIR")
    return Path(env) if env else Path(f"/tmp/gpu-hazards-{os.getuid()}")


def boot_id() -> str:
    """This boot's id: a record from another boot has nothing left running."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _private_dir(path: Path) -> Path:
    """`path` as a folder only this user can use (created 0700; a link or a folder of
    someone else is refused: records name processes to kill)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise OSError(errno.EPERM, f"{path} is not a private folder of this user")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, sort_keys=True, default=str) + "\n").encode()


class SupervisorRecord:
    """This process's record (docs/architecture.md, In the code). Writes are single O_APPEND lines,
    safe from any thread. `open` raises OSError when no record can be kept."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd, self.owner = path, fd, os.getpid()
        self._live: dict[str, bytes] = {}  # "kind:key" -> its start line, in start order
        self._head = b""                   # the supervisor line
        self._size = 0                     # bytes in the file
        self._mu = threading.Lock()

    @classmethod
    def open(cls) -> "SupervisorRecord":
        folder = _private_dir(_private_dir(runtime_dir()) / RECORD_DIR)
        me = os.getpid()
        path = folder / f"{me}-{start_ticks(me)}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours: a pid and start time are unique
        rec = cls(path, fd)
        rec._head = _line({"supervisor": {"pid": me, "ticks": start_ticks(me), "boot_id": boot_id(),
                                          "host": os.uname().nodename, "started": time.time(),
                                          "argv": sys.argv[:6]}})
        rec._write(rec._head)
        return rec

    def _write(self, line: bytes) -> None:
        if self._fd is None or os.getpid() != self.owner:  # a forked child must not write ours
            return
        try:
            self._size += os.write(self._fd, line)
        except OSError:
            pass  # a full /tmp must not stop a run; the record is a safety net

    def _start(self, kind: str, key: str, fields: dict[str, Any]) -> None:
        line = _line({kind: fields})
        with self._mu:
            self._live[f"{kind}:{key}"] = line
            self._write(line)

    def _end(self, kind: str, key: str, fields: Any) -> None:
        with self._mu:
            self._live.pop(f"{kind}:{key}", None)
            self._write(_line({f"{kind}_end": fields}))
            if self._size >= COMPACT_BYTES:
                self._compact()

    def _compact(self) -> None:
        """Rewrite the record as its supervisor line and live entries, in place, when they
        need under a quarter of it (see docs/architecture.md, In the code, for a death meanwhile)."""
        snapshot = self._head + b"".join(self._live.values())
        if 4 * len(snapshot) > self._size or self._fd is None or os.getpid() != self.owner:
            return
        try:  # a second descriptor: pwrite on an O_APPEND one would append
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if os.fstat(fd).st_ino != os.fstat(self._fd).st_ino:
                return  # not our file any more: leave it
            os.pwrite(fd, snapshot, 0)
            os.ftruncate(fd, len(snapshot))
            self._size = len(snapshot)
        except OSError:
            pass
        finally:
            os.close(fd)

    def child(self, pid: int, pgid: int, ticks: int, mark: str, cgroup: str | None) -> None:
        """A child started (`mark`: its environment marker, NAME=VALUE)."""
        self._start("child", str(pid), {"pid": pid, "pgid": pgid, "ticks": ticks, "mark": mark,
                                         "cgroup": cgroup})

    def child_end(self, pid: int) -> None:
        """A child and every descendant of it are gone."""
        self._end("child", str(pid), pid)

    def cgroup_root(self, path: str) -> None:
        """This supervisor's cgroup folder (the children's cgroups are inside it)."""
        self._start("cgroup_root", path, path)

    def cgroup_root_end(self, path: str) -> None:
        self._end("cgroup_root", path, path)

    def file(self, path: str) -> None:
        """A file to remove if we die (a tripwire file in /dev/shm)."""
        self._start("file", path, path)

    def file_end(self, path: str) -> None:
        self._end("file", path, path)

    def campaign(self, store: str, campaign_id: int) -> None:
        """A campaign running in `store` (to be marked interrupted if we die)."""
        self._start("campaign", f"{store}#{campaign_id}", {"store": store, "id": campaign_id})

    def campaign_end(self, store: str, campaign_id: int) -> None:
        self._end("campaign", f"{store}#{campaign_id}", {"store": store, "id": campaign_id})

    def close(self) -> None:
        """At a normal exit: delete the record if nothing in it is left to clean up, else
        leave it (with its lock released by the exit) to the guardian or the next start."""
        if self._fd is None or os.getpid() != self.owner:
            return
        if not self._live:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        os.close(self._fd)
        self._fd = None

    def forget_after_fork(self) -> None:
        """In a forked child: drop our copy of the descriptor (the lock stays the parent's)."""
        if self._fd is not None and os.getpid() != self.owner:
            os.close(self._fd)
            self._fd = None


def read_record(path: Path | str) -> dict[str, Any]:
    """What a record says: its `supervisor`, the `children`, `files`, `cgroup_roots` and
    `campaigns` started and not ended, its `cleaned` report (None until cleaned) and the
    campaigns already `marked`."""
    state: dict[str, Any] = {"supervisor": {}, "children": {}, "files": [], "cgroup_roots": [],
                             "campaigns": [], "cleaned": None, "marked": []}
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return state
    for raw in lines:
        try:
            (kind, value), = json.loads(raw).items()
        except (ValueError, AttributeError):
            continue  # a line cut short by the death it records
        if kind == "supervisor":
            state["supervisor"] = value
        elif kind == "child":
            state["children"][value["pid"]] = value
        elif kind == "child_end":
            state["children"].pop(value, None)
        elif kind in ("file", "cgroup_root", "campaign"):
            if value not in state[f"{kind}s"]:  # once each, as a rewritten record holds them
                state[f"{kind}s"].append(value)
        elif kind in ("file_end", "cgroup_root_end", "campaign_end"):
            items = state[f"{kind[:-4]}s"]
            if value in items:
                items.remove(value)
        elif kind == "cleaned":
            state["cleaned"] = value
        elif kind == "marked":
            state["marked"].append(value)
    return state


def _group_is_the_childs(pgid: int, leader_ticks: int) -> bool:
    """Whether process group `pgid` is still the recorded child's: a live process with
    that pid must be the leader itself (same start time). While any process is in a group,
    its id cannot be given to a new process, so a group without its leader is the child's."""
    ticks = start_ticks(pgid)
    return ticks == 0 or ticks == leader_ticks


def clean(state: dict[str, Any], by: str) -> dict[str, Any]:
    """Kill what a dead supervisor's record lists, remove its cgroups and files; a report."""
    reaped: set[int] = set()
    same_boot = state["supervisor"].get("boot_id") in ("", boot_id())
    for child in state["children"].values() if same_boot else ():
        mark = (child.get("mark") or "").encode() or None
        victims = scan_for(child["pgid"], mark, child.get("ticks", 0)) \
            if _group_is_the_childs(child["pgid"], child.get("ticks", 0)) \
            else scan_for(-1, mark, child.get("ticks", 0))
        victims |= cgroup_pids(child.get("cgroup"))
        if child.get("cgroup"):
            kill_cgroup(child["cgroup"])
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reaped |= victims
    cgroups = [c["cgroup"] for c in state["children"].values() if c.get("cgroup")] + state["cgroup_roots"]
    removed_cgroups = [c for c in cgroups if _remove_tree(c)] if same_boot else []
    removed_files = []
    for path in state["files"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # unlink never follows a link: only the named entry goes
            removed_files.append(path)
    sup = state["supervisor"]
    return {"supervisor_pid": sup.get("pid"), "supervisor_argv": sup.get("argv"), "by": by,
            "at": time.time(), "processes": sorted(reaped),
            "process_groups": sorted({c["pgid"] for c in state["children"].values()}),
            "cgroups": removed_cgroups, "files": removed_files}


def _remove_tree(cgroup: str, wait_s: float = 10.0) -> bool:
    """Kill everything in a cgroup folder and its sub-folders, then remove them all."""
    if not os.path.isdir(cgroup):
        return True
    kill_cgroup(cgroup)  # cgroup.kill reaches the whole subtree
    try:
        with os.scandir(cgroup) as entries:
            subs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return True  # another supervisor starting at the same moment swept it first
    return all([_remove_tree(sub, wait_s) for sub in subs]) and remove_cgroup(cgroup, wait_s)


CGROUP_ROOT_PREFIX = "hazards-"


def cgroup_root_name() -> str:
    """The name of this process's cgroup folder: hazards-<pid>-<start ticks>, so a later
    process can tell, from the name alone, that its supervisor is gone."""
    return f"{CGROUP_ROOT_PREFIX}{os.getpid()}-{start_ticks(os.getpid())}"


def sweep_cgroups(parent: str | os.PathLike[str]) -> list[str]:
    """Kill and remove the cgroup folders under `parent` of supervisors that are gone
    (their record may be gone too: a cleared /tmp); the folders removed."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(CGROUP_ROOT_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            pid, ticks = (int(x) for x in name[len(CGROUP_ROOT_PREFIX):].split("-")[:2])
        except ValueError:
            continue
        if start_ticks(pid) != ticks and _remove_tree(entry.path):
            removed.append(entry.path)
    return removed


def supervisor_alive(supervisor: dict[str, Any]) -> bool:
    """Whether the supervisor a record or session names (pid, start ticks, boot) still runs."""
    pid = supervisor.get("pid")
    return bool(pid) and supervisor.get("boot_id") == boot_id() and start_ticks(int(pid)) == supervisor.get("ticks")


@contextlib.contextmanager
def _locked(path: Path, wait_s: float) -> Iterator[int | None]:
    """The record's lock if its supervisor is gone (None while it lives). A record locked
    by a cleaner (its supervisor dead) is waited for up to `wait_s`."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if supervisor_alive(read_record(path)["supervisor"]) or time.monotonic() >= deadline:
                    yield None
                    return
                time.sleep(0.05)
        yield fd if os.fstat(fd).st_nlink else None  # deleted meanwhile: nothing to do
    finally:
        os.close(fd)


def recover(store: str | None = None, mark: Callable[[int, dict[str, Any]], bool] | None = None,
            by: str = "next start", wait_s: float = WAIT_FOR_CLEANER_S) -> list[dict[str, Any]]:
    """Clean the record of every dead supervisor of this user (if nobody did), and for the
    campaigns they list in `store`, call `mark(campaign_id, report)` (True once marked).
    Returns the cleaning reports of the records that listed campaigns in `store`."""
    folder = runtime_dir() / RECORD_DIR
    try:
        paths = sorted(folder.glob("*.jsonl"))
    except OSError:
        return []
    reports = []
    for path in paths:
        with _locked(path, wait_s) as fd:
            if fd is None:
                continue
            state = read_record(path)
            report = state["cleaned"]
            if report is None:
                report = clean(state, by)
                os.write(fd, _line({"cleaned": report}))
            pending = [c for c in state["campaigns"] if c not in state["marked"]]
            for camp in pending:
                if store is not None and mark is not None and camp["store"] == store:
                    reports.append(report)
                    if mark(int(camp["id"]), report):
                        os.write(fd, _line({"marked": camp}))
                        state["marked"].append(camp)
            # a campaign whose store file is gone (a deleted folder) has nothing left to mark
            left = [c for c in state["campaigns"] if c not in state["marked"] and os.path.exists(c["store"])]
            if not left or time.time() - report.get("at", time.time()) > STALE_S:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return reports


def guard(path: str) -> int:
    """The guardian: wait for the supervisor that holds `path` to die, then clean its record."""
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # a hung-up terminal must not take us too
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while the supervisor lives
    if os.fstat(fd).st_nlink == 0:  # it exited normally and deleted its record
        return 0
    state = read_record(path)
    if state["cleaned"] is None:
        os.write(fd, _line({"cleaned": clean(state, "guardian")}))
    if not state["campaigns"]:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--guard":
        sys.exit(guard(sys.argv[2]))
    print("usage: python3 -m hazards.engine.recovery --guard RECORD", file=sys.stderr)
    sys.exit(2)
