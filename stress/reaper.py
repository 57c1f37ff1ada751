"""Keeper of one leased command: it dies with the broker and takes the command's whole tree along.

Standard library only; run as a script by hazards.engine.broker:
    python3 reaper.py BROKER_PID -- CMD ARGS...
More in docs/campaigns.md.
"""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
DEATH_SIGNAL = signal.SIGUSR2  # the broker died
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 5.0


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc)."""
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(name))
    return out


def _descendants(pid: int) -> list[int]:
    seen, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in seen:
                seen.append(child)
                todo.append(child)
    return seen


def _reap_nowait() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(pgid: int | None) -> None:
    """SIGKILL the command's group and every descendant of this reaper, until none is left."""
    me = os.getpid()
    for _ in range(50):
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        left = _descendants(me)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap_nowait()
        if not left and not _group_alive(pgid):
            return
        time.sleep(0.02)


def _group_alive(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
        return True
    except OSError as exc:
        return exc.errno == errno.EPERM


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("reaper: usage: reaper.py BROKER_PID -- CMD ARGS...", file=sys.stderr)
        return 2
    broker, cmd = int(argv[0]), argv[2:]
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    state: dict = {"pgid": None, "stop": None}

    def on_death(signum: int, frame: object) -> None:
        kill_tree(state["pgid"])
        os._exit(128 + signal.SIGKILL)

    signal.signal(DEATH_SIGNAL, on_death)
    if not _prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL):
        print("reaper: cannot ask to be told of the broker's death (prctl); refusing to run", file=sys.stderr)
        return 2
    if os.getppid() != broker:  # the broker died before the request took effect
        return 128 + signal.SIGKILL

    def on_forward(signum: int, frame: object) -> None:
        if state["pgid"] is not None:
            try:
                os.killpg(state["pgid"], signum)
            except OSError:
                pass
        if state["stop"] is None:
            state["stop"] = time.monotonic() + GRACE_S

    for sig in FORWARDED:
        signal.signal(sig, on_forward)
    try:
        child = subprocess.Popen(cmd, start_new_session=True)
    except OSError as exc:
        print(f"reaper: cannot start {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127 if exc.errno == errno.ENOENT else 126
    state["pgid"] = child.pid
    while True:
        try:
            rc = child.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if state["stop"] is not None and time.monotonic() > state["stop"]:
                kill_tree(state["pgid"])
    kill_tree(state["pgid"])  # leftovers of the command's tree must not outlive the lease
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
