"""Shared helpers for the static-check tests: toolchain skips and small listing builders."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hazards.engine.toolchain import find_tool
from hazards.engine.errors import ToolchainMissing

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def _missing(finder) -> str | None:
    try:
        finder()
        return None
    except ToolchainMissing as e:
        return str(e)


CLANG_MISSING = _missing(lambda: find_tool("clang"))
NVCC_MISSING = _missing(lambda: find_tool("nvcc"))
NVDISASM_MISSING = _missing(lambda: find_tool("nvdisasm"))

requires_clang = pytest.mark.skipif(CLANG_MISSING is not None,
                                    reason=f"needs clang-19 with AMDGPU: {CLANG_MISSING}")
requires_nvcc = pytest.mark.skipif(NVCC_MISSING is not None, reason=f"needs nvcc: {NVCC_MISSING}")
requires_nvdisasm = pytest.mark.skipif(
    NVCC_MISSING is not None or NVDISASM_MISSING is not None,
    reason=f"needs nvcc and nvdisasm: {NVCC_MISSING or NVDISASM_MISSING}")


def listing(body: str, name: str = "k") -> str:
    """A minimal AMDGCN listing: one function whose body is `body` (tab-indented lines)."""
    lines = "\n".join("\t" + ln.strip() if not ln.strip().endswith(":") else ln.strip()
                      for ln in body.strip().split("\n"))
    return f'\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942"\n{name}:\n{lines}\n\ts_endpgm\n'


def failing_ids(findings) -> set[str]:
    """The ids of the findings that fail a check."""
    return {f.check for f in findings if f.fails}


def hazards(*args: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python3 -m hazards ARGS` with the repository on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "hazards", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
