"""Children die with their supervisor, and every descendant of a run is ours to kill.

How a child is started (`spawn`, used by the watchdog for every child it supervises), step
by step, is in docs/architecture.md."""
from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from .proctree import kill_cgroup, remove_cgroup, start_ticks
from .recovery import SupervisorRecord, cgroup_root_name, sweep_cgroups

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CGROUP_ENV = "HZ_CGROUP"  # "off": no cgroup per child
# Joins the cgroup named by $0, then runs the rest ("$@": setpriv ... -- program args).
_JOIN_CGROUP = 'echo 0 2>/dev/null >"$0"; exec "$@"'


def _libc_prctl() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def _cgroup2_dir() -> tuple[Path | None, str]:
    """This process's cgroup v2 folder, or (None, why not)."""
    try:
        own = next((ln[3:] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if ln.startswith("0::")), None)
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as e:
        return None, f"cannot read /proc: {e.strerror}"
    if own is None:
        return None, "no cgroup v2 hierarchy (cgroup v1 only)"
    for line in mounts:
        fields = line.split()
        sep = fields.index("-") if "-" in fields else -1
        if sep > 0 and fields[sep + 1] == "cgroup2":
            root, mountpoint = fields[3], fields[4]
            rel = own[len(root):] if root != "/" and own.startswith(root) else own
            return Path(mountpoint + rel.rstrip("/")), ""
    return None, "cgroup v2 is not mounted"


class _Spawner(threading.Thread):
    """Forks children on behalf of other threads: a parent-death signal fires when the
    thread that forked exits, and this thread lives as long as the process."""

    def __init__(self) -> None:
        super().__init__(name="hz-spawner", daemon=True)
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            fn, box, done = self.jobs.get()
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                box["error"] = e
            done.set()

    def call(self, fn: Callable[[], Any]) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()
        self.jobs.put((fn, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]


class Containment:
    """The process-wide state of the mechanisms above (one instance: `CONTAINMENT`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ready_pid: int | None = None
        self.prctl = _libc_prctl()
        self.setpriv: str | None = None
        self.sh: str | None = None
        self.cgroup_root: str | None = None
        self.cgroup_note = ""
        self.record: Any = None
        self.record_note = ""
        self.subreaper = False
        self.guardian: int | None = None
        self.supervise = False  # become a subreaper with a guardian before the first child
        self._spawner: _Spawner | None = None
        self._runs = itertools.count(1)
        self._live: dict[int, tuple[str | None, int]] = {}  # pid -> (cgroup, pidfd or -1)

    # -- setting up -------------------------------------------------------------------
    def _ensure(self) -> None:
        if self._ready_pid == os.getpid():
            return
        with self._lock:
            if self._ready_pid == os.getpid():
                return
            supervise = self.supervise and self._ready_pid is None  # not in a forked child
            self.__init__()  # a forked child starts afresh (its parent's threads are gone)
            self._ready_pid = os.getpid()
            self.supervise = supervise
            self.setpriv = _working_setpriv()
            self.sh = shutil.which("sh")
            self._open_record()
            self._make_cgroup_root()
            if self.supervise:
                self.supervise_process()

    def _open_record(self) -> None:
        try:
            self.record = SupervisorRecord.open()
        except OSError as e:
            self.record_note = f"no record of children ({e.strerror or e})"
            return
        atexit.register(self._at_exit)

    def _make_cgroup_root(self) -> None:
        if os.environ.get(CGROUP_ENV, "").lower() in ("0", "off", "no", "false"):
            self.cgroup_note = f"cgroups turned off ({CGROUP_ENV})"
            return
        if self.sh is None and self.prctl is None:
            self.cgroup_note = "no sh and no prctl to join a cgroup with"
            return
        own, why = _cgroup2_dir()
        if own is None:
            self.cgroup_note = why
            return
        sweep_cgroups(own)  # folders of supervisors that died here before us
        root = own / cgroup_root_name()
        try:
            os.mkdir(root)
        except OSError as e:
            self.cgroup_note = f"cgroup {own} is not delegated to us ({e.strerror})"
            return
        self.cgroup_root = str(root)
        if self.record is not None:
            self.record.cgroup_root(self.cgroup_root)
        probe = self._new_cgroup()
        try:
            show = ["cat", "/proc/self/cgroup"] if shutil.which("cat") else \
                [sys.executable, "-c", "print(open('/proc/self/cgroup').read())"]
            out = self._popen(show, probe, dict(stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                                stdin=subprocess.DEVNULL, env=dict(os.environ)))
            text = out.communicate(timeout=30)[0].decode()
        except (OSError, subprocess.SubprocessError) as e:
            text = f"probe failed: {e}"
        finally:
            remove_cgroup(probe)
        if not any(line.startswith("0::") and probe.endswith(line[3:].strip()) for line in text.splitlines()):
            self.cgroup_note = f"cannot move a child into {probe} ({text.strip()[:100] or 'no answer'})"
            self._drop_cgroup_root()

    def _drop_cgroup_root(self) -> None:
        if self.cgroup_root is not None:
            if remove_cgroup(self.cgroup_root) and self.record is not None:
                self.record.cgroup_root_end(self.cgroup_root)
            self.cgroup_root = None

    def _at_exit(self) -> None:
        if self._ready_pid != os.getpid():
            return
        self._drop_cgroup_root()
        if self.record is not None:
            self.record.close()

    def supervise_when_spawning(self) -> None:
        """`supervise_process()` when the first child is started (a command that starts
        none, `hazards report`, pays nothing)."""
        self.supervise = True

    def supervise_process(self) -> None:
        """Make this process a child subreaper and start its guardian (idempotent)."""
        self._ensure()
        with self._lock:
            if not self.subreaper and self.prctl is not None:
                self.subreaper = self.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            if self.guardian is None and self.record is not None:
                self.guardian = _start_guardian(str(self.record.path))

    # -- starting and ending children -------------------------------------------------
    def _new_cgroup(self) -> str:
        path = os.path.join(self.cgroup_root, f"run-{next(self._runs)}")  # type: ignore[arg-type]
        os.mkdir(path)
        return path

    def _popen(self, argv: list[str], cgroup: str | None, kw: dict[str, Any]) -> subprocess.Popen:
        """Start `argv` with a parent-death signal, in `cgroup` if given, in a new session."""
        preexec, procs = None, -1
        if self.setpriv is not None:
            argv = [self.setpriv, "--pdeathsig", "KILL", "--", *argv]
            if cgroup is not None:
                argv = [self.sh, "-c", _JOIN_CGROUP, os.path.join(cgroup, "cgroup.procs"), *argv]  # type: ignore[list-item]
        elif self.prctl is not None or cgroup is not None:
            if cgroup is not None:
                procs = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            preexec = _pre_exec_hook(self.prctl, os.getpid(), procs)
        spawn = lambda: subprocess.Popen(argv, start_new_session=True, close_fds=True,  # noqa: E731
                                         preexec_fn=preexec, **kw)
        try:
            if threading.current_thread() is threading.main_thread():
                return spawn()
            with self._lock:
                if self._spawner is None or not self._spawner.is_alive():
                    self._spawner = _Spawner()
                    self._spawner.start()
            return self._spawner.call(spawn)
        finally:
            if procs >= 0:
                os.close(procs)

    def spawn(self, argv: list[str], *, mark: str, **popen_kwargs: Any) -> tuple[subprocess.Popen, str | None]:
        """Start a supervised child (docs/architecture.md, In the code): (its Popen, its cgroup)."""
        self._ensure()
        cgroup = None
        if self.cgroup_root is not None:
            try:
                cgroup = self._new_cgroup()
            except OSError:
                cgroup = None
        try:
            proc = self._popen(list(argv), cgroup, popen_kwargs)
        except BaseException:
            if cgroup is not None:
                remove_cgroup(cgroup)
            raise
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:
            pidfd = -1
        with self._lock:
            self._live[proc.pid] = (cgroup, pidfd)
        if self.record is not None:
            self.record.child(proc.pid, proc.pid, start_ticks(proc.pid), mark, cgroup)
        return proc, cgroup

    def ended(self, pid: int) -> None:
        """The child `pid` and all its descendants are gone (its cgroup was removed)."""
        with self._lock:
            _, pidfd = self._live.pop(pid, (None, -1))
        if pidfd >= 0:
            os.close(pidfd)
        if self.record is not None:
            self.record.child_end(pid)

    def live_pids(self) -> set[int]:
        """The pids of the supervised children alive now (the roots of their trees)."""
        with self._lock:
            return set(self._live)

    def stop_all(self) -> int:
        """SIGKILL every live child tree now (an interrupt: the runs in flight are given up);
        how many trees were signalled. Their owners still reap and verify as usual."""
        with self._lock:
            live = list(self._live.values())
        for cgroup, pidfd in live:
            if cgroup is not None:
                kill_cgroup(cgroup)
            if pidfd >= 0:
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except OSError:
                    pass
        return len(live)

    def track_file(self, path: str, live: bool = True) -> None:
        """Record a file to remove if this process dies (`live=False`: it was removed)."""
        self._ensure()
        if self.record is not None:
            (self.record.file if live else self.record.file_end)(path)

    def track_campaign(self, store: str, campaign_id: int, live: bool = True) -> None:
        """Record a campaign running in `store` (`live=False`: its status was set)."""
        self._ensure()
        if self.record is not None:
            (self.record.campaign if live else self.record.campaign_end)(store, campaign_id)

    def describe(self) -> dict[str, Any]:
        """Which mechanisms are active in this process, in words a campaign spec keeps."""
        self._ensure()
        pdeathsig = ("setpriv --pdeathsig KILL" if self.setpriv else
                     "pre-exec prctl(PR_SET_PDEATHSIG)" if self.prctl else "none (no setpriv, no prctl)")
        return {"pdeathsig": pdeathsig,
                "cgroup": self.cgroup_root or f"none: {self.cgroup_note}",
                "subreaper": self.subreaper, "guardian": self.guardian,
                "record": str(self.record.path) if self.record is not None else f"none: {self.record_note}"}


def _working_setpriv() -> str | None:
    """setpriv, if it is installed and knows --pdeathsig (util-linux 2.33 or later)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        ok = subprocess.run([path, "--pdeathsig", "KILL", "--", "true"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return path if ok else None


def _pre_exec_hook(prctl: Callable[..., int] | None, parent: int, procs: int) -> Callable[[], None]:
    """What the child runs between fork and exec where setpriv is missing: ask for SIGKILL
    at the parent's death, give up if the parent is already gone, join the cgroup whose
    cgroup.procs is open as `procs` (-1: none)."""

    def hook() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(137)
        if procs >= 0:
            try:
                os.write(procs, b"0")
            except OSError:
                pass
    return hook


def _start_guardian(record: str) -> int | None:
    """Start the guardian of `record` in a session of its own; its pid (None if it cannot)."""
    import hazards

    root = str(Path(hazards.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.Popen([sys.executable, "-m", "hazards.engine.recovery", "--guard", record],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                                env=env, cwd="/")
    except OSError:
        return None
    proc.returncode = 0  # never waited for: it outlives us by design (no ResourceWarning)
    return proc.pid


CONTAINMENT = Containment()


def _after_fork_in_child() -> None:
    record = CONTAINMENT.record
    if record is not None:
        record.forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
