"""Emitted code: with HZ_TRIPWIRE off no tripwire store remains; on, the stores are there.

PTX from nvcc (sm_90a) and AMDGCN from clang-19 (gfx942), both on the CPU. The probe
kernel has exactly one store of its own, so "off" must leave exactly one.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from hazards.engine import toolchain
from hazards.engine.errors import ToolchainMissing
from hazards.kernel_sources import include_dir

HERE = Path(__file__).resolve().parent
INCLUDE = include_dir()
PROBE = HERE / "ptx_probe.cu"


def _tool_or_skip(name: str) -> str:
    try:
        return toolchain.find_tool(name)
    except ToolchainMissing as e:
        pytest.skip(f"cannot check the emitted code: {e}")


def _ptx_stores(on: bool) -> list[str]:
    from hazards.static.compile import compile_ptx

    _tool_or_skip("nvcc")
    ptx = compile_ptx(PROBE, defines={"HZ_TRIPWIRE": None} if on else None, label=f"test-tripwire-probe-{on}",
                      extra_args=(f"-I{INCLUDE}",)).text  # through the build cache: no nvcc per session
    return re.findall(r"^\s*(st\.\S+)", ptx, re.MULTILINE)


def _amdgcn_stores(tmp_path: Path, on: bool) -> list[str]:
    clang = _tool_or_skip("clang")
    out = tmp_path / f"probe_{on}.s"
    cmd = [clang, *toolchain.AMD_DEVICE_ONLY_FLAGS, toolchain.amd_arch_flag(), "-O3", "-S", "-include", str(HERE / "hip_shim.h"), f"-I{INCLUDE}", str(PROBE), "-o", str(out)]
    r = subprocess.run(cmd + (["-DHZ_TRIPWIRE"] if on else []), capture_output=True, text=True)
    if r.returncode != 0 and "amdgcn" in r.stderr.lower() and "target" in r.stderr.lower():
        pytest.skip(f"clang-19 has no AMDGPU backend: {r.stderr.strip().splitlines()[0]}")
    assert r.returncode == 0, r.stderr
    return re.findall(r"^\s*((?:global|flat|buffer)_store.*)$", out.read_text(), re.MULTILINE)


def test_ptx_without_tripwire_keeps_only_the_kernels_own_store() -> None:
    assert _ptx_stores(on=False) == ["st.global.f32"]


def test_ptx_with_tripwire_has_volatile_64_bit_and_byte_stores() -> None:
    stores = _ptx_stores(on=True)
    assert stores.count("st.global.f32") == 1
    tw = [s for s in stores if s != "st.global.f32"]
    assert tw and all(s.startswith("st.volatile.") for s in tw)
    assert any(s.endswith(".u64") for s in tw) and any(s.endswith(".u8") for s in tw)


def test_amdgcn_without_tripwire_keeps_only_the_kernels_own_store(tmp_path: Path) -> None:
    assert len(_amdgcn_stores(tmp_path, on=False)) == 1


def test_amdgcn_with_tripwire_stores_system_coherent(tmp_path: Path) -> None:
    stores = _amdgcn_stores(tmp_path, on=True)
    coherent = [s for s in stores if "sc0 sc1" in s]  # volatile -> system scope on gfx942
    assert len(stores) > 1 and len(coherent) == len(stores) - 1
