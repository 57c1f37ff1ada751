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


def sass_listing(body: str) -> str:
    """A minimal SASS listing (`nvdisasm -c` layout): one kernel `k` whose instructions are the
    lines of `body` (a line ending in `:` is a label), 16 bytes apart."""
    lines = []
    for k, raw in enumerate(body.strip().splitlines()):
        raw = raw.strip()
        lines.append(raw if raw.endswith(":") else f"        /*{16 * k:04x}*/                   {raw} ;")
    return "//--- .text.k ---\n.text.k:\n" + "\n".join(lines) + "\n"


def failing_ids(findings) -> set[str]:
    """The ids of the findings that fail a check."""
    return {f.check for f in findings if f.fails}


def hazards(*args: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python3 -m hazards ARGS` with the repository on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "hazards", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# The MI355 PR's shape in two loads: a plain "=v" output may land on the second load's address.
TWO_LOADS = '''
__global__ void k(const float4* p, float4* o) {
  float4 a, b;
  asm volatile("global_load_dwordx4 %0, %2, off\\n\\t"
               "global_load_dwordx4 %1, %3, off\\n\\t"
               "s_waitcnt vmcnt(0)"
               : "=v"(a), "=v"(b) : "v"(p), "v"(p + 1));
  o[0] = a; o[1] = b;
}
'''

# A loop written in asm; {C} is the scratch output's constraint (=v: flagged, =&v: clean).
ASM_LOOP = '''__global__ void k(const long* p, long* o, int n) {
  long tmp;
  long acc = 0;
  const long* q = p + threadIdx.x * 64;
  asm volatile("1:\\n\\t"
               "global_load_dwordx2 %0, %3, off\\n\\t"
               "s_waitcnt vmcnt(0)\\n\\t"
               "v_lshl_add_u64 %1, %1, 0, %0\\n\\t"
               "s_sub_u32 %2, %2, 1\\n\\t"
               "s_cmp_lg_u32 %2, 0\\n\\t"
               "s_cbranch_scc1 1b"
               : "{C}"(tmp), "+v"(acc), "+s"(n) : "v"(q));
  o[0] = acc;
}
'''
