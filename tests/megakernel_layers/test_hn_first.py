"""Campaign step (s) (candidate step_s, -DMKL_HN_FIRST=1 on production): a W13 tile copies hn (the router's
normalised hidden state) to shared memory before it issues its tile's L2 prefetch; production issues the
prefetch first, and round 24's sub-spans put the hn copy at 3.0 us a tile behind every worker's prefetch burst
(0.6 us with no W13 prefetch at all).

On the CPU (nvcc 13.0, sm_90a): step_s is production's switches with MKL_HN_FIRST on and nothing else, and
other machine code; in the kernel's source a tile's W13 prefetch sits before the hn copy with the switch off,
and with it on after the copy on the worker's first tile and at production's place on a later one (hn already
copied); the catalog names step_s on production with that one define. On a GPU (marker gpu): step (s)
gives production's bits (the order of a prefetch and a copy changes no value), clean and with stale_descriptor
corrupting alike.
"""
from __future__ import annotations

import re

import pytest

from hazards.megakernel_layers import faithful as FA

from . import test_production_step22 as T22
from .bits import assert_same_bits
from .test_merge_spread import ROOT

STEP_S = {"MKL_HN_FIRST": 1}
W13_PREFETCH = "prefetch_w13_tile(w13, c0, c1, s.D);"  # the tile's prefetch, written once (prefetch_w13_tile)


def _w13_region(hn_first: int) -> list[str]:
    """The W13 loop's source lines with MKL_HN_FIRST's #if / #else / #endif resolved (other conditions kept)."""
    src = (ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh").read_text()
    region = src[src.index("// ---- expert W13 tiles"):src.index("// ---- expert W2 rows")].splitlines()
    out, stack = [], []  # stack: per open #if, None (not ours) or whether its current branch is kept
    for line in region:
        s = line.strip()
        if s.startswith("#if"):
            stack.append(bool(hn_first) if s == "#if MKL_HN_FIRST" else None)
            if stack[-1] is not None:
                continue
        elif s == "#else" and stack and stack[-1] is not None:
            stack[-1] = not stack[-1]
            continue
        elif s.startswith("#endif"):
            if stack.pop() is not None:
                continue
        if all(k is not False for k in stack):
            out.append(s)
    return out


def _prefetches(lines: list[str]) -> list[int]:
    return [i for i, s in enumerate(lines) if s.startswith(W13_PREFETCH) or s.endswith(W13_PREFETCH)]


def test_production_prefetches_the_tile_before_the_hn_copy():
    lines = _w13_region(0)
    copy = lines.index("copy_to_shared_block(arena, p.hn, s.D);  // step (l): 1-2 float4s a thread, then the stores")
    assert [lines[i] for i in _prefetches(lines)] == [f"if (tid < 32) {W13_PREFETCH}"]
    assert _prefetches(lines)[0] < copy


def test_step_s_prefetches_the_first_tile_after_the_hn_copy_and_a_later_tile_where_production_does():
    lines = _w13_region(1)
    copy = lines.index("copy_to_shared_block(arena, p.hn, s.D);  // step (l): 1-2 float4s a thread, then the stores")
    later, first = _prefetches(lines)
    assert lines[later] == f"if (have_hn && tid < 32) {W13_PREFETCH}" and later < copy  # production's place, hn copied
    assert lines[first] == f"if (tid < 32) {W13_PREFETCH}"
    assert copy < lines.index("__syncthreads();", copy) < first < lines.index("have_hn = true;")


def test_the_w13_tile_prefetch_is_one_helper_that_every_place_calls():
    """The tile's address and size are written once (prefetch_w13_tile), not at each of the three places that
    issue the prefetch (production's and step (s)'s two), so that the places cannot prefetch different bytes."""
    src = (ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh").read_text()
    helper = src[src.index("__device__ __forceinline__ void prefetch_w13_tile("):]
    helper = helper[:helper.index("\n}\n")]
    assert "prefetch_l2_head(w13 + (size_t)2 * c0 * D, (long long)(c1 - c0) * 2 * D * 2, PREFETCH_W13);" in helper
    assert src.count("PREFETCH_W13)") == 1 and src.count("prefetch_l2_head(w13") == 1
    assert len(_prefetches(_w13_region(0))) == 1 and len(_prefetches(_w13_region(1))) == 2


def test_step_s_is_production_with_its_switch_alone_and_other_machine_code():
    prod, step = T22._switches({}), T22._switches(STEP_S)
    assert prod["MKL_HN_FIRST"] == 0 and step["MKL_HN_FIRST"] == 1
    assert {k: v for k, v in step.items() if k != "MKL_HN_FIRST"} == {k: v for k, v in prod.items() if k != "MKL_HN_FIRST"}
    assert T22._sass_lines(None, "test-mkl-step-default") != T22._sass_lines(STEP_S, "test-mkl-hn-first")


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
