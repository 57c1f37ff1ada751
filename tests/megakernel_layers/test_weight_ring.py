"""Campaign step (c): the matrix-vector phases stream their weights through a shared-memory
ring of bulk copies (MKL_CAMPAIGN_STEP 4), production through global loads.

Round 4's profile had every matrix-vector phase at 14-26 GB/s per SM; the ragged-decode
kernel's cp.async.bulk ring streams ~175 GB/s from one SM. Machine code (sm_90a, nvcc +
nvdisasm on the CPU) of ring_probe.cu, the block GEMV alone: in the step (c) build the
consumer reads the weights from shared memory only, behind mbarrier waits, and the refill is
a bulk copy completing on an mbarrier; production's GEMV loop loads them from global memory.
(That the ring streams every GEMV of both model shapes and fits an sm_90 block's shared
memory is a static_assert in mkl_kernel.cuh: the step (c) build would not compile.)
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from hazards.engine.toolchain import find_tool
from hazards.static.compile import compile_cubin, compile_ptx
from tests.static.static_helpers import requires_nvcc, requires_nvdisasm

from .sass_text import function_listings

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


INCLUDES = (f"-I{ROOT / 'standalone' / 'megakernel_layers'}", f"-I{ROOT / 'standalone' / 'include'}")


def _functions(step: int) -> dict[str, str]:
    """SASS text per device function of the probe (the kernel itself under 'gemv_probe')."""
    cubin = compile_cubin(HERE / "ring_probe.cu", defines={"MKL_CAMPAIGN_STEP": step}, label=f"test-ring-probe-{step}",
                          extra_args=INCLUDES).path
    text = subprocess.run([find_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    return function_listings(text, ("ring_units", "gemv_ring", "gemv_round", "gemv_probe"))


def _count(sass: str, pattern: str) -> int:
    return len(re.findall(pattern, sass))


@requires_nvdisasm
@pytest.mark.parametrize("step", [15, 21], ids=["step_15", "production"])
def test_step_15_and_production_stream_the_weights_with_global_loads(step: int):
    funcs = _functions(step)  # step (d)'s GEMV, which is step 2's: step 15's, step 21's and production's (step 22) too
    assert "ring_units" not in funcs and "gemv_round" in funcs, sorted(funcs)
    every = "".join(funcs.values())
    assert _count(funcs["gemv_round"], r"\bLDG\.E\S*\.128\b") >= 16  # depth 4 x 4 rows in flight
    assert _count(every, r"\bUBLKCP\b") == 0 and _count(every, r"\bSYNCS\.") == 0


@requires_nvdisasm
def test_step_c_streams_the_weights_through_the_shared_memory_ring():
    funcs = _functions(4)
    assert "ring_units" in funcs, sorted(funcs)
    ring = funcs["ring_units"]
    assert _count(ring, r"\bLDG\b") == 0, "the consumer must not load weights from global memory"
    assert _count(ring, r"\bLDS\.128\b") >= 12  # 4 chunks a lane: weights + two float4 of activations each
    assert _count(ring, r"\bSYNCS\.PHASECHK\.TRANS64\.TRYWAIT\b") >= 2  # wait full; warp 0 waits empty
    assert _count(ring, r"\bSYNCS\.ARRIVE\.TRANS64") >= 2  # arrive empty; refill's arrive.expect_tx
    assert _count(ring, r"\bUBLKCP\.S\.G\b") == 1  # the refill: one bulk copy global -> shared
    # the first RING_STAGES units are issued by gemv_ring (thread 0) before the consumers start
    assert _count(funcs["gemv_ring"], r"\bUBLKCP\.S\.G\b") >= 1


def _probe_ptx(defines: dict[str, int]) -> str:
    return compile_ptx(HERE / "ring_probe.cu", defines=defines, label="test-ring-probe-ptx", extra_args=INCLUDES).text


def _block_smem(ptx: str) -> int:
    """The dynamic shared memory a block of the default model asks for (ring_probe.cu's constant)."""
    m = re.search(r"probe_smem_default\s*=\s*(\d+)", ptx)
    assert m, "ring_probe.cu's probe_smem_default is not in the PTX"
    return int(m.group(1))


@requires_nvcc
def test_the_ring_smem_build_is_step_b0_code_asking_for_step_c_shared_memory():
    """Round 5's diagnostic build (MKL_RESERVE_RING_SMEM, gate candidate ring_smem): step (c)'s
    base, step_b0 (the production of round 5), with a block asking for step (c)'s shared memory
    (so the SM keeps step (c)'s small L1) and no ring in it. Since round 8's promotion the
    default build is not step 2 (step (d), then steps 10, 14 and 15): the candidate names step 2 itself, so it still isolates the
    carve-out from the ring."""
    from hazards.megakernel_layers import faithful as FA

    assert dict(FA.candidate("ring_smem").defines) == {"MKL_CAMPAIGN_STEP": 2, "MKL_RESERVE_RING_SMEM": 1}
    ring = _probe_ptx({"MKL_CAMPAIGN_STEP": 4})
    reserved = _probe_ptx({"MKL_CAMPAIGN_STEP": 2, "MKL_RESERVE_RING_SMEM": 1})
    step_b0 = _probe_ptx({"MKL_CAMPAIGN_STEP": 2})
    assert _block_smem(reserved) == _block_smem(ring) > _block_smem(step_b0) + (128 << 10)
    assert "cp.async.bulk.shared" in ring and "mbarrier" in ring
    assert "cp.async.bulk.shared" not in reserved and "mbarrier" not in reserved  # step_b0's GEMV, no ring
