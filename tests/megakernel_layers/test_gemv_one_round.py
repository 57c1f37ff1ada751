"""Campaign step (i) (MKL_CAMPAIGN_STEP 11, candidate step_i, round 15): step 10 (production then; since
round 17 candidate step_10, step (i)'s base) with the
GEMVs' row groups split into column parts of at most one round of gemv_round<4> where a warp then
takes fewer dependent rounds (gemv_kparts_rounds in mkl_kernel.cuh).

On the CPU (nvcc 13.0, sm_90a): ring_probe.cu's kparts_probe stores the split gemv_block takes at depth
4 for the default shape's four GEMVs on one worker of 132 (constants in the PTX). Production (step 21,
step 10's GEMVs) splits the QKV tile, the O-projection, W13 and W2 into 2, 8, 1 and 2 column parts: 4,
3, 9 and 6 dependent rounds a warp; step (i) into 3, 4, 1 and 3: 3, 2, 9 and 5. The loop itself is
step 10's (16 weight loads a lane before the first FFMA), no function of the step (i) build spills
more than step 10's (ptxas -v), and the compiled static checks pass it with step 10's polls (no wait
moved). On the branch that added step (i) step 10 was production and the default build's machine code
was main d0217f6's, line for line (79,188 lines of cuobjdump -sass); what production's is now is
test_production_step22.py's. Before this change MKL_CAMPAIGN_STEP 11 built step (e)'s kernel (no flag
read 11) and the probe had no gemv_block_kparts: the split tests fail there, and the step (i) split
assertion fails on step 10's build.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hazards.megakernel_layers import faithful as FA
from hazards.megakernel_layers.model import SHAPES, HD, QKV_TILE_ROWS, row_begin, w13_tiles

from .sass_text import function_instances, longest_load_run, spills_by_function, spills_grown
from .test_merge_spread import assert_static_checks_pass_with_the_polls_of, family_cubin, listing_of
from .test_production_step22 import switches_changed_from_step_10

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
INCLUDES = (f"-I{ROOT / 'standalone' / 'megakernel_layers'}", f"-I{ROOT / 'standalone' / 'include'}")
NWARPS, GEMV_ROWS, ROUND_CHUNKS = 16, 4, 32 * 4  # mkl_kernel.cuh: 512 threads, rows an item, chunks a round
SITES = ("qkv", "oproj", "moe_w13", "moe_w2")


def _site_shapes(workers: int = 132) -> dict[str, tuple[int, int, int]]:
    """(row groups, segments, 8-column chunks a row) of each GEMV on worker 0 of the default shape: what
    kparts_probe passes to gemv_block_kparts."""
    s = SHAPES["default"]
    groups = lambda rows: -(-rows // GEMV_ROWS)  # noqa: E731
    rows = row_begin(1, workers, s.D) - row_begin(0, workers, s.D)
    t13 = w13_tiles(workers, s.K)
    w13_rows = 2 * (-(-s.I // t13))  # the widest tile's rows (gate and up of each channel)
    return {"qkv": (groups(QKV_TILE_ROWS), 1, s.D // 8), "oproj": (groups(rows), 1, s.NQ * HD // 8),
            "moe_w13": (groups(w13_rows), 1, s.D // 8), "moe_w2": (groups(rows), s.K, s.I // 8)}


def _warp_rounds(site: tuple[int, int, int], kparts: int) -> int:
    """Dependent rounds of gemv_round<4> on the busiest warp: its items one after the other, each in
    rounds of 4 chunk iterations (one reduction round: the sites' items fit GEMV_MAX_ITEMS)."""
    ngroups, nseg, nchunk = site
    items, per_part = ngroups * nseg * kparts, -(-nchunk // kparts)
    return -(-items // NWARPS) * -(-(-(-per_part // 32)) // 4)


def probe_stores(step: int, entry: str) -> list[int]:
    """The constants ring_probe.cu's kernel `entry` (mangled, e.g. _Z12kparts_probePi) stores to out[0..n)
    in the build of `step`, read from its PTX."""
    from hazards.engine.errors import ToolchainMissing
    from hazards.static.compile import compile_ptx

    try:
        ptx = compile_ptx(HERE / "ring_probe.cu", defines={"MKL_CAMPAIGN_STEP": step}, label=f"test-kparts-probe-{step}",
                          extra_args=INCLUDES).text
    except ToolchainMissing as e:
        pytest.skip(f"cannot build the probe: {e}")
    body = ptx[ptx.index(f".entry {entry}"):]
    body = body[:body.index("\n}\n")]
    regs = dict(re.findall(r"mov\.u32\s+(%r\d+),\s*(\d+);", body))
    stores = re.findall(r"st\.global\.u32\s+\[%rd\d+(?:\+(\d+))?\],\s*(%r\d+|\d+);", body)
    values = {int(off or 0) // 4: int(regs.get(v, v)) for off, v in stores}
    assert sorted(values) == list(range(len(values))), body
    return [values[i] for i in range(len(values))]


def _kparts(step: int) -> dict[str, int]:
    """The column parts gemv_block takes at each site in the build of `step` (kparts_probe's stores)."""
    values = probe_stores(step, "_Z12kparts_probePi")
    assert len(values) == len(SITES), values
    return dict(zip(SITES, values))


def test_the_probe_passes_the_default_shape_sites_on_132_workers():
    """kparts_probe's constants are these sites' (a change of the model or the schedule shows here)."""
    src = (HERE / "ring_probe.cu").read_text()
    shapes = _site_shapes()
    for site in SITES:
        assert "gemv_block_kparts(4, {}, {}, {})".format(*shapes[site]) in src, (site, shapes[site])


def test_production_splits_the_gemvs_in_powers_of_two():
    kp = _kparts(14)  # step 10's splits (step (l) changes copies, not the GEMVs)
    assert kp == {"qkv": 2, "oproj": 8, "moe_w13": 1, "moe_w2": 2}
    shapes = _site_shapes()
    assert {s: _warp_rounds(shapes[s], kp[s]) for s in SITES} == {"qkv": 4, "oproj": 3, "moe_w13": 9, "moe_w2": 6}


def test_step_i_splits_qkv_oproj_and_w2_into_parts_of_one_round_and_takes_fewer_rounds_a_warp():
    kp = _kparts(11)
    assert kp == {"qkv": 3, "oproj": 4, "moe_w13": 1, "moe_w2": 3}
    shapes = _site_shapes()
    for s in ("qkv", "oproj", "moe_w2"):
        assert -(-shapes[s][2] // kp[s]) <= ROUND_CHUNKS, s  # every part fits one round
    assert {s: _warp_rounds(shapes[s], kp[s]) for s in SITES} == {"qkv": 3, "oproj": 2, "moe_w13": 9, "moe_w2": 5}


def _spills(defines: dict[str, int] | None, label: str) -> tuple[str, dict[str, tuple[int, int]]]:
    """(SASS listing, {function: (spill store bytes, spill load bytes)}) of the family's build, from ptxas -v
    (spills_by_function: each device function at its worst copy; which of them keeps a 4-B spill store
    of attend_chunk moves between builds)."""
    cubin = family_cubin(defines, label, "-Xptxas=-v")
    return listing_of(cubin), spills_by_function(cubin.log)


def assert_step_10_loop_and_no_more_spills(defines: dict[str, int], label: str, added: tuple[str, ...] = ()):
    """The build of `defines` spills no more than step 10's (its base; production from round 14 until step
    14) in any function (ptxas -v; `added`: names in the functions it adds, which step 10 lacks) and both
    keep the GEMV loop's 16 loads a lane."""
    prod_sass, prod = _spills({"MKL_CAMPAIGN_STEP": 10}, f"{label}-step10")
    step_sass, step = _spills(defines, label)
    new = {k for k in set(step) - set(prod) if not any(a in k for a in added)}
    assert set(prod) <= set(step) and not new and any("mkl_megakernel" in k for k in prod), sorted(step)
    worse = spills_grown(prod, step)
    assert not worse, worse
    for sass in (prod_sass, step_sass):
        loops = function_instances(sass, "gemv_roundILi4")
        assert len(loops) == 2 and all(longest_load_run(b) >= 16 for b in loops)  # 4 rows x 4 iterations a lane


def test_step_i_keeps_step_10_loop_and_spills_no_more_than_step_10_anywhere():
    assert_step_10_loop_and_no_more_spills({"MKL_CAMPAIGN_STEP": 11}, "test-mkl-step-i-spills")


def test_step_i_passes_the_compiled_static_checks_with_step_10_polls():
    assert_static_checks_pass_with_the_polls_of(11, 10)


def test_step_i_is_step_10_but_for_the_split_and_a_candidate_of_the_gate():
    c = FA.candidate("step_i")
    assert dict(c.defines) == {"MKL_CAMPAIGN_STEP": 11} and c.params == ()
    assert c.expected == "slower"  # round 15: slower than step 10, which is slower than production
    changed, _, step = switches_changed_from_step_10({"MKL_CAMPAIGN_STEP": 11})
    assert changed == {"MKL_CAMPAIGN_STEP", "MKL_GEMV_ONE_ROUND"}
    assert step["MKL_GEMV_ONE_ROUND"] == 1 and step["MKL_W2_QUANT_AHEAD"] == 1
