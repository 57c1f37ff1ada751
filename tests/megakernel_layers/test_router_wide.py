"""Campaign step (p) (MKL_CAMPAIGN_STEP 18, candidate step_p, switch MKL_ROUTER_WIDE; in production since promote21,
step 21, with step (r)'s switch): step 15 (production then: "production" below, the step-15 build, PROD) with the
router's last block on a short dependent chain. The default build is step 21's code since promote21
(test_production_step22.py).

Every worker's ROUTING wait is behind the one block that arrived last at OPROJ (round 20's sub-spans, an
H100: partials 1.6, hn 0.9, top-k 4.3, publish 0.6 us a layer). In production's harness build
(stress.build.target_flags, -split-compile=0) router_from_partials' `#pragma unroll 9` loop over the
workers' partials runs its remainder first, one load and one add an iteration: at 132 workers a thread of
groups 12-14 sums 8 partials, 8 dependent L2 round trips; the payload's loads of h and norm go out after
the partials are summed (one more); three block barriers; the top-k keeps its picks in local memory (STL,
LDL) and its softmax is unrolled for K up to 16. On the CPU (nvcc 13.0, sm_90a, nvdisasm): step 18's
switches are production's plus MKL_ROUTER_WIDE alone; its router_from_partials_wide issues every load of
a thread before its first add (the payload's 12 and a pass of 9 partials: one pass at 132 workers), has
one block barrier and no local memory, and is shorter than production's function; no function spills
more than production's; the compiled static checks count production's polls (no wait added or moved);
production's router tail is unchanged. With the switch block or the function removed, each test here fails
(the switch table: no MKL_ROUTER_WIDE; the SASS ones: no router_from_partials_wide in the step-18 build).
"""
from __future__ import annotations

import re

import pytest

from hazards.megakernel_layers import faithful as FA

from . import test_production_step22 as P22
from .sass_text import function_instances, loop_bodies, spills_by_function, spills_grown
from .test_merge_spread import _sass, assert_static_checks_pass_with_the_polls_of, family_cubin, listing_of

STEP_P = {"MKL_CAMPAIGN_STEP": 18}
PROD = 15  # step (p)'s base: production's step until promote21
PART_AHEAD = 9        # mkl_kernel.cuh ROUTER_PART_AHEAD: partials a thread loads before its first add
WORKERS, GROUPS = 132, 15  # the default grid; THREADS / (E + 1) groups of partials at E = 32
GLOBAL_LOAD = r"\bLDG?\.E\b"  # a global (LDG) or generic (LD) load: the partials, h, norm
FP_ADD = r"\bFADD\b"


def test_step_18_is_step_15_with_the_wide_router_switch_alone():
    """No other step (the other candidates of the twelfth and thirteenth sessions, 17, 19 and 20, and the
    earlier ones) turns it on; production (the default build, step 21 since promote21) has it; -D turns it on
    beside another step's switch."""
    P22.assert_step_is_step_15_with_its_switch_alone(18, "MKL_ROUTER_WIDE")
    assert P22._switches({"MKL_CAMPAIGN_STEP": 19, "MKL_ROUTER_WIDE": 1})["MKL_ROUTER_WIDE"] == 1


def test_every_preprocessor_condition_reads_step_18_as_step_15_with_the_wide_router():
    """A raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give 18 what it gives 15 (its base)."""
    P22.assert_every_condition_reads_step_as_step_15_with(18, "MKL_ROUTER_WIDE")


def test_step_p_is_a_candidate_of_the_gate_in_production_with_step_r():
    c = FA.candidate("step_p")
    # against step 21 (step 18 + step (r)'s switch): no-change, a prediction (step (r) alone no-change on both
    # launches in round 23); against production (step 22: step 21 + step (t)'s merge) slower as step_21, a
    # prediction; round 22's and 23's verdicts against step 15 kept
    assert dict(c.defines) == STEP_P and c.params == () and c.expected == "slower"
    assert "in production since step 21" in c.what and "round 22" in c.what and "round 23" in c.what
    d = FA.candidate("step_p_topk_twice")
    assert dict(d.defines) == {**STEP_P, "MKL_ROUTER_TOPK_REPS": 2} and d.params == ()


def one_load_loops(sass: str) -> int:
    """Loop bodies (a backward branch's target up to the branch) that load once from global memory and
    add what they loaded before the branch: each pass one dependent L2 round trip."""
    n = 0
    for body in loop_bodies(sass):
        loads = [i for i, b in enumerate(body) if re.search(GLOBAL_LOAD, b)]
        if len(loads) == 1 and any(re.search(FP_ADD, b) for b in body[loads[0]:]):
            n += 1
    return n


def loads_before_first_add(sass: str) -> int:
    """Global loads issued, in listing order, before the function's first FADD."""
    n = 0
    for line in sass.splitlines():
        if re.search(FP_ADD, line):
            return n
        n += bool(re.search(GLOBAL_LOAD, line))
    return n


@pytest.fixture(scope="module")
def routers() -> tuple[str, str]:
    """(step 15's router_from_partials, step 18's router_from_partials_wide): the plain kernel's instance."""
    prod = function_instances(_sass(PROD), "router_from_partials")
    wide = function_instances(_sass(18), "router_from_partials_wide")
    assert prod and wide, "a build lacks its router tail"
    return prod[0], wide[0]


def test_step_15_sums_its_partials_one_dependent_load_at_a_time_and_step_18_in_one_pass(routers):
    prod, wide = routers
    # production: the unroll-9 loop's remainder, one load and one add an iteration (8 at 132 workers for
    # groups 12-14: 132 = 15 x 8 + 12), then the payload's loads after the partials are summed
    assert one_load_loops(prod) >= 1
    # step 18: no such loop; a thread's payload loads (6 of h, 6 of norm) and a pass of partials before its
    # first add, and one pass covers every worker of the default grid
    assert one_load_loops(wide) == 0
    assert loads_before_first_add(wide) >= 12 + PART_AHEAD, loads_before_first_add(wide)
    assert -(-WORKERS // (GROUPS * PART_AHEAD)) == 1


def test_step_18_router_has_one_block_barrier_and_no_local_memory(routers):
    prod, wide = routers
    barriers = lambda s: len(re.findall(r"\bBAR\.SYNC\b", s))  # noqa: E731
    assert barriers(prod) == 3 and barriers(wide) == 1
    # production keeps the picks in a local array (sel[16]): stores and loads of local memory
    assert re.search(r"\b(STL|LDL)\b", prod)
    assert not re.search(r"\b(STL|LDL)\b", wide)
    # the payload's loads precede the barrier (they are off the chain); production's follow all three
    first_bar = next(i for i, l in enumerate(wide.splitlines()) if "BAR.SYNC" in l)
    assert len(re.findall(GLOBAL_LOAD, "\n".join(wide.splitlines()[:first_bar]))) >= 12 + PART_AHEAD
    # the block runs this code once a layer: fewer instructions than production's tail (no unrolled softmax)
    count = lambda s: len(re.findall(r"/\*[0-9a-f]{4,}\*/", s))  # noqa: E731
    assert count(wide) < 0.8 * count(prod), (count(wide), count(prod))


def test_step_18_top_k_is_the_warp_butterfly_from_registers(routers):
    _, wide = routers
    assert len(re.findall(r"\bSHFL\.BFLY\b", wide)) >= 2 * 5  # value and index, 5 steps a pick
    assert re.search(r"\bSHFL\.IDX\b", wide)  # lane 0's pick broadcast; the den sum's shuffles
    # the logits reach the top-k from registers: the only shared loads are the group sums' columns
    assert not re.search(r"\bSTS\b", wide.split("BAR.SYNC", 1)[1])


def test_step_18_spills_no_more_than_step_15_and_its_router_spills_nothing():
    prod = spills_by_function(family_cubin({"MKL_CAMPAIGN_STEP": PROD}, "test-mkl-step-15-v", "-Xptxas=-v").log)
    step = spills_by_function(family_cubin(STEP_P, "test-mkl-step-18", "-Xptxas=-v").log)
    assert any("mkl_megakernel" in k for k in prod), sorted(prod)
    assert not spills_grown({k: v for k, v in prod.items() if k in step}, step)
    assert set(prod) - set(step) == {k for k in prod if k.endswith("router_from_partialsENS_5ShapeEPKfS2_S2_iPfPiS3_S3_")}
    wide = [v for k, v in step.items() if "router_from_partials_wide" in k]
    assert wide and all(v == (0, 0) for v in wide), wide


def test_step_18_passes_the_compiled_static_checks_with_step_15_polls():
    assert_static_checks_pass_with_the_polls_of(18, PROD)


def test_the_diagnostic_runs_the_same_top_k_code_twice_and_the_candidate_once():
    """MKL_ROUTER_TOPK_REPS 2 loops over one copy of the top-k (the second run finds its code hot); at 1
    the loop leaves no trace: step 18's machine code."""
    twice = listing_of(family_cubin({**STEP_P, "MKL_ROUTER_TOPK_REPS": 2}, "test-mkl-step-18-topk-twice"))
    wide2 = function_instances(twice, "router_from_partials_wide")[0]
    wide1 = function_instances(_sass(18), "router_from_partials_wide")[0]
    bfly = lambda s: len(re.findall(r"\bSHFL\.BFLY\b", s))  # noqa: E731
    assert bfly(wide2) == bfly(wide1)  # one copy of the butterfly, not two
    strip = lambda s: [re.sub(r"/\*[0-9a-f]+\*/", "", l).strip() for l in s.splitlines()  # noqa: E731
                       if l.strip() and not l.lstrip().startswith("//")]
    once = listing_of(family_cubin({**STEP_P, "MKL_ROUTER_TOPK_REPS": 1}, "test-mkl-step-18-topk-once"))
    assert strip(once) == strip(_sass(18))


def test_the_wide_top_k_picks_by_step_15s_pick_written_once():
    """select_topk_warp_regs (step (p), production's top-k) and select_topk_warp (step (e), step 15's) run one
    text for a pick, MKL_TOPK_WARP_PICK (a macro: an inline helper changed production's PTX): the two cannot
    pick differently by an edit to one of them."""
    src = P22.KERNEL.read_text()
    for fn in ("select_topk_warp", "select_topk_warp_regs"):
        body = src[src.index(f"__device__ __forceinline__ void {fn}("):]
        body = body[:body.index("\n}\n")]
        assert body.count("MKL_TOPK_WARP_PICK(v, i, v0, v1, i0, i1, have0, have1);") == 1, fn
        assert "__shfl_xor_sync" not in body, fn
    assert src.count("const int ib = __shfl_xor_sync(0xffffffffu, i, o);") == 1
