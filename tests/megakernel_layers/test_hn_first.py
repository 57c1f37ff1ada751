"""Campaign step (s) (candidate step_s, -DMKL_HN_FIRST=1 on production): a W13 tile copies hn (the router's
normalised hidden state) to shared memory before it issues its tile's L2 prefetch; production issues the
prefetch first, and round 24's sub-spans put the hn copy at 3.0 us a tile behind every worker's prefetch burst
(0.6 us with no W13 prefetch at all).

On the CPU (nvcc 13.0, sm_90a): the switch off is production's machine code line for line, on it is not; in the
kernel's source the W13 prefetch sits before the hn copy with the switch off and after it with the switch on,
and nowhere else; the catalog names step_s on production with that one define. On a GPU (marker gpu): step (s)
gives production's bits (the order of a prefetch and a copy changes no value), clean and with stale_descriptor
corrupting alike.
"""
from __future__ import annotations

import re

import pytest

from hazards.megakernel_layers import faithful as FA

from . import test_production_step21 as T21
from .bits import assert_same_bits
from .test_merge_spread import ROOT

STEP_S = {"MKL_HN_FIRST": 1}
W13_PREFETCH = "prefetch_l2_head(w13 + (size_t)2 * c0 * s.D, (long long)(c1 - c0) * 2 * s.D * 2, PREFETCH_W13);"


def _w13_region() -> str:
    src = (ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh").read_text()
    return src[src.index("// ---- expert W13 tiles"):src.index("// ---- expert W2 rows")]


def test_the_w13_prefetch_is_issued_before_the_hn_copy_off_and_after_it_on():
    w13 = _w13_region()
    sites = [m.start() for m in re.finditer(re.escape(W13_PREFETCH), w13)]
    assert len(sites) == 2, sites
    copy = w13.index("copy_to_shared_block(arena, p.hn, s.D);")
    first, second = sites
    assert first < copy < second
    # each site under its own side of the switch: the directive above its line (a comment between allowed)
    lines = w13.splitlines()
    at = [i for i, line in enumerate(lines) if W13_PREFETCH in line]
    above = [next(lines[j].strip() for j in range(i - 1, -1, -1) if not lines[j].strip().startswith("//"))
             for i in at]
    assert above == ["#if !MKL_HN_FIRST", "#if MKL_HN_FIRST"]


def test_step_s_off_is_production_line_for_line_and_on_is_not():
    prod = T21._sass_lines(None, "test-mkl-step-default")
    T21._assert_same_sass(prod, T21._sass_lines({"MKL_HN_FIRST": 0}, "test-mkl-hn-first-off"))
    assert prod != T21._sass_lines(STEP_S, "test-mkl-hn-first")


def test_the_catalog_names_step_s_on_production_with_its_switch_alone():
    c = FA.candidate("step_s")
    assert dict(c.defines) == STEP_S
    assert c.expected == "no-change" and "prediction" in c.what


@pytest.mark.gpu
@pytest.mark.parametrize("params", [
    {"layers": 2, "seq": 1024},
    {"layers": 2, "seq": 1024, "grid": 64, "chunks": 64},             # 64 workers: two W13 tiles a worker
    {"layers": 2, "seq": 1024, "hazard": "stale_descriptor"},         # the stale KV and W2 pointers still corrupt
], ids=["default", "grid64", "stale_descriptor"])
def test_step_s_gives_production_bits(params: dict):
    """Every checked launch clean against the binary's reference (corrupted, with stale_descriptor on) and the
    output production's bit for bit."""
    assert_same_bits(STEP_S, None, params)
