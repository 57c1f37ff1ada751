"""Shared by the fake targets: record every pid we start so tests can prove none survives."""
import os


def record_pid(pid: int | None = None) -> None:
    """Append `pid` (default: ours) to the file named by $HZ_FAKE_PIDFILE, if set."""
    path = os.environ.get("HZ_FAKE_PIDFILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{pid or os.getpid()}\n")
            f.flush()
            os.fsync(f.fileno())
