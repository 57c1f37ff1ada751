"""Emitted code: with HZ_PROFILER off the probe keeps only its own store and reads no clock;
on, each span reads the clock, claims a slot atomically and stores its record.

PTX from nvcc (sm_90a) and AMDGCN from clang-19 (gfx942), both on the CPU. The probe
kernel (prof_probe.cu) has exactly one store of its own.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
INCLUDE = ROOT / "standalone" / "include"
PROBE = HERE / "prof_probe.cu"
SHIM = ROOT / "tests" / "tripwire" / "hip_shim.h"


def _ptx(src: Path, on: bool) -> str:
    """The PTX for sm_90a, through the build cache (keyed by every included file): the
    layered megakernel's two builds cost seconds of CPU each, every session otherwise."""
    from hazards.engine.errors import ToolchainMissing
    from hazards.static.compile import compile_ptx

    try:
        return compile_ptx(src, defines={"HZ_PROFILER": None} if on else None,
                           label=f"test-{src.stem}-profiler-{on}", extra_args=(f"-I{INCLUDE}",)).text
    except ToolchainMissing as e:
        pytest.skip(f"cannot check the emitted PTX: {e}")


def _amdgcn(tmp_path: Path, on: bool) -> str:
    clang = shutil.which("clang-19")
    if clang is None:
        pytest.skip("clang-19 not installed: cannot check the AMDGCN code")
    out = tmp_path / f"probe_{on}.s"
    cmd = [clang, "-x", "hip", "--offload-arch=gfx942", "-nogpulib", "-nogpuinc", "--cuda-device-only", "-O3",
           "-S", "-include", str(SHIM), f"-I{INCLUDE}", str(PROBE), "-o", str(out)]
    r = subprocess.run(cmd + (["-DHZ_PROFILER"] if on else []), capture_output=True, text=True)
    if r.returncode != 0 and "amdgcn" in r.stderr.lower() and "target" in r.stderr.lower():
        pytest.skip(f"clang-19 has no AMDGPU backend: {r.stderr.strip().splitlines()[0]}")
    assert r.returncode == 0, r.stderr
    return out.read_text()


def _stores(ptx: str) -> list[str]:
    return re.findall(r"^\s*(st\.\S+)", ptx, re.MULTILINE)


def test_ptx_without_profiler_keeps_only_the_kernels_own_store_and_reads_no_clock() -> None:
    ptx = _ptx(PROBE, on=False)
    assert _stores(ptx) == ["st.global.f32"]
    assert "%globaltimer" not in ptx and "%smid" not in ptx and "atom." not in ptx


def test_ptx_with_profiler_claims_a_slot_and_stores_four_words_per_span() -> None:
    ptx = _ptx(PROBE, on=True)
    stores = _stores(ptx)
    assert stores.count("st.global.f32") == 1
    records = [s for s in stores if s != "st.global.f32"]
    assert records and set(records) == {"st.global.u64"} and len(records) % 4 == 0
    claims = re.findall(r"atom\.global\.add\.u64", ptx)
    assert len(claims) == len(records) // 4  # one claim per recorded span
    assert "%globaltimer" in ptx and "%smid" in ptx


def test_amdgcn_without_profiler_keeps_only_the_kernels_own_store(tmp_path: Path) -> None:
    asm = _amdgcn(tmp_path, on=False)
    assert len(re.findall(r"^\s*(?:global|flat|buffer)_store", asm, re.MULTILINE)) == 1
    assert "s_memrealtime" not in asm and "atomic" not in asm


def test_amdgcn_with_profiler_reads_the_constant_rate_clock_and_claims_atomically(tmp_path: Path) -> None:
    asm = _amdgcn(tmp_path, on=True)
    assert "s_memrealtime" in asm
    assert re.search(r"global_atomic_add_x2", asm)
    assert len(re.findall(r"^\s*(?:global|flat|buffer)_store", asm, re.MULTILINE)) > 1


MEGAKERNEL = ROOT / "standalone" / "megakernel" / "ragged_decode.cu"


def test_the_megakernel_without_profiler_reads_no_clock_and_stores_nothing_extra() -> None:
    off = _ptx(MEGAKERNEL, on=False)
    on = _ptx(MEGAKERNEL, on=True)
    assert "%globaltimer" not in off and "%smid" not in off and "atom.global.add.u64" not in off
    claims = len(re.findall(r"atom\.global\.add\.u64", on))
    assert claims == 6  # one per recording site: prologue, attend (x2), merge, fill, worker
    # the profiled build adds exactly the records' four 8-byte stores per site, nothing else
    extra = len(_stores(on)) - len(_stores(off))
    assert extra == 4 * claims
    assert _stores(on).count("st.global.u64") - _stores(off).count("st.global.u64") == 4 * claims


LAYERED = ROOT / "standalone" / "megakernel_layers" / "megakernel_layers.cu"
LAYERED_SITES = 8  # QKV, attention chunk, merge, O-projection, router/top-k, W13, W2, worker


@pytest.fixture(scope="module")
def layered_ptx() -> tuple[str, str]:
    return _ptx(LAYERED, on=False), _ptx(LAYERED, on=True)


def _record_stores(ptx: str) -> list[str]:
    """Stores other than call arguments (st.param), which an out-of-line recorder's calls add."""
    return [s for s in _stores(ptx) if not s.startswith("st.param")]


def _u64_claims(ptx: str) -> int:
    return len(re.findall(r"atom(?:\.global)?\.add\.u64", ptx))


def test_the_layered_megakernel_without_profiler_reads_no_clock_and_records_nothing(layered_ptx) -> None:
    off, on = layered_ptx
    assert "%globaltimer" not in off and "%smid" not in off and "mkl_prof_record" not in off
    # everything else is the same code: the profiled build differs only by its recorder (below)
    assert len(re.findall(r"^\s*call", on, re.MULTILINE)) - len(re.findall(r"^\s*call", off, re.MULTILINE)) \
        == 2 * LAYERED_SITES


def test_the_layered_megakernel_with_profiler_records_through_one_recorder_at_every_site(layered_ptx) -> None:
    off, on = layered_ptx
    # one out-of-line recorder: one claim and four 8-byte stores in the whole binary ...
    assert _u64_claims(on) - _u64_claims(off) == 1
    assert len(_record_stores(on)) - len(_record_stores(off)) == 4
    assert (sum(s in ("st.u64", "st.global.u64") for s in _record_stores(on))
            - sum(s in ("st.u64", "st.global.u64") for s in _record_stores(off))) == 4
    # ... called from every recording site of both kernel instances (tripwire in and out)
    calls = re.findall(r"call(?:\.uni)?\s*(?:\(\s*\w+\s*\)\s*,\s*)?\n?\s*(\w+)", on)
    assert sum("mkl_prof_record" in c for c in calls) == 2 * LAYERED_SITES
    assert "%globaltimer" in on and "%smid" in on
