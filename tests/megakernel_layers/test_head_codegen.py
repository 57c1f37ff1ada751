"""The layer head's single-block tasks issue their loads ahead (campaign steps a, b0).

Round 3's LSE merge read a batch with `b < cnt ? load : 0` and nvcc made each load a
predicated LDG consumed at once by its FFMA: a chain of dependent L2 round trips on one block
(67-73 us a layer on the H200). Its router issued one 16-B weight load per loop iteration.
Its router's weight loop (unrolled by nvcc) had two 16-B loads in flight per lane.
Machine code (sm_90a, nvcc + nvdisasm on the CPU) of the probe kernels in head_probe.cu: the
longest run of global loads issued before the next FFMA, per build of MKL_CAMPAIGN_STEP.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hazards.engine.toolchain import find_tool
from hazards.static.compile import compile_cubin
from tests.static.static_helpers import requires_nvdisasm

from .sass_text import MERGE_BATCH, function_listings, longest_load_run

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _sass(step: int) -> dict[str, str]:
    """Each device function's SASS text, for the build MKL_CAMPAIGN_STEP=step."""
    cubin = compile_cubin(HERE / "head_probe.cu", defines={"MKL_CAMPAIGN_STEP": step}, label=f"test-head-probe-{step}",
                          extra_args=(f"-I{ROOT / 'standalone' / 'megakernel_layers'}",
                                      f"-I{ROOT / 'standalone' / 'include'}")).path  # build cache: keyed by the headers
    text = subprocess.run([find_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    return function_listings(text, ("merge_chunks", "router_topk"))


@requires_nvdisasm
@pytest.mark.parametrize("step, merge_ahead, router_ahead",
                         [(0, False, False), (1, True, False), (2, True, True), (3, True, True), (4, True, True),
                          (5, True, True)])
def test_the_head_tasks_issue_their_loads_ahead_from_their_campaign_step(step: int,
                                                                        merge_ahead: bool, router_ahead: bool) -> None:
    funcs = _sass(step)
    assert set(funcs) == {"merge_chunks", "router_topk"}, sorted(funcs)
    merge = longest_load_run(funcs["merge_chunks"])
    router = longest_load_run(funcs["router_topk"], r"\bLDG\S*\.128\b")  # the weights (16 B), not h
    assert (merge >= MERGE_BATCH) == merge_ahead, merge
    assert (router >= 8) == router_ahead, router
