"""The repro evidence target, and what `hazards repro` keeps besides the runs.

The context a failure needs to be reproduced elsewhere (binary hash, `git describe`,
environment) and the kernel's word on it (Xid lines from the kernel log when `dmesg` is
readable; NVML's Xid events of the leased GPU are in every run's telemetry, from the loop).
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..outcome import RunResult
from ..targets.base import Target, WrapperTarget, run_kw, supported_kw
from ..telemetry import KernelLog

# Environment entries never written to an artifact (they may hold credentials).
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|(^|_)KEY($|_)|AUTH|COOKIE|SESSION", re.IGNORECASE)


def sha256_of(path: str | os.PathLike[str]) -> str | None:
    """Hex SHA-256 of a file, None when it cannot be read."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def resolve_program(argv0: str, cwd: str | None = None) -> str | None:
    """The file argv[0] runs (PATH lookup for bare names)."""
    if os.sep in argv0:
        p = Path(argv0) if os.path.isabs(argv0) or cwd is None else Path(cwd) / argv0
        return str(p.resolve()) if p.exists() else None
    found = shutil.which(argv0)
    return str(Path(found).resolve()) if found else None


def git_describe(cwd: str | None) -> str | None:
    """`git describe --always --dirty --tags` of cwd, None outside a repository."""
    try:
        r = subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=cwd or None,
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def safe_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with anything that looks like a credential left out."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in sorted(env.items()) if not _SECRET.search(k)}


def run_context(argv: list[str], cwd: str | None = None) -> dict[str, Any]:
    """Everything about where and what ran that is not in a single run's result."""
    program = resolve_program(argv[0], cwd) if argv else None
    scripts = [a for a in argv[1:] if a.endswith((".py", ".sh")) and Path(cwd or ".", a).exists()]
    return {
        "argv": list(argv), "cwd": cwd or os.getcwd(), "host": socket.gethostname(),
        "program": program, "program_sha256": sha256_of(program) if program else None,
        "scripts_sha256": {s: sha256_of(Path(cwd or ".", s)) for s in scripts},
        "git_describe": git_describe(cwd), "python": sys.version.split()[0],
        "platform": platform.platform(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": safe_environment(),
    }


class ReproTarget(WrapperTarget):
    """Wraps a target: after each run, the Xid/NVRM lines the kernel log gained during it
    (`evidence["xid"]["kernel_log"]`, or why the log could not be read)."""

    def __init__(self, inner: Target, kernel_log: KernelLog | None = None) -> None:
        super().__init__(inner)
        self.kernel_log = kernel_log or KernelLog()

    def run(self, params: dict | None = None, *, timeout: float, launches: int | None = None,
            artifact_dir: Path | None = None, stall: float | None = None,
            cutoff: float | None = None) -> RunResult:
        r = self.inner.run(params, timeout=timeout, launches=launches, artifact_dir=artifact_dir,
                           **supported_kw(self.inner, run_kw(stall, cutoff)))
        lines = self.kernel_log.new_lines()
        log = self.kernel_log
        r.evidence["xid"] = {"kernel_log": lines if log.readable else f"unreadable: {log.why}"}
        return r
