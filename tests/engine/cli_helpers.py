"""Helpers for tests that drive the real `python3 -m hazards` entry point."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def hazards(*args: str, cwd: Path, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python3 -m hazards ARGS` from `cwd` with the repo on PYTHONPATH."""
    full_env = {k: v for k, v in os.environ.items() if k != "HZ_STORE"}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "hazards", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> list[str]:
    """Every path under root (to check that nothing was created)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))
