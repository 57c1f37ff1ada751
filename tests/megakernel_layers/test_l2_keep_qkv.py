"""Campaign step (k) (MKL_CAMPAIGN_STEP 13, candidate step_k, round 16): step 10 (production then; since
round 17 candidate step_10, step (k)'s base) with the
next layer's QKV weights kept in L2 across the MoE (MKL_L2_KEEP_QKV in mkl_kernel.cuh).

On the CPU (nvcc 13.0, sm_90a): the step-13 build's PTX creates an L2::evict_last policy for the
bulk prefetches of the next layer's QKV tiles (cp.async.bulk.prefetch.L2 ... L2::cache_hint), an
L2::evict_first policy for every weight load of the GEMV loop (gemv_round: ld.global.nc ...
L2::cache_hint), and demotes a tile it has read (applypriority L2::evict_normal); its SASS carries
them (UBLKPF.L2 with a descriptor operand, CCTL.E.DML2) where step 10's has none (and production's PTX
no L2 policy). The loop keeps step 10's shape (16 weight loads a lane before the first FFMA), no
function spills more than in step 10 (ptxas -v), and the compiled static checks pass it with step 10's
polls (no wait added or moved). On the branch that added step (k) step 10 was production and the
default build was main 5bc3109's (79,188 lines of cuobjdump -sass); production's machine code now is
test_production_step22.py's. Before this change MKL_CAMPAIGN_STEP 13 built step (e)'s kernel (no switch
read 13): the policy tests fail there.
"""
from __future__ import annotations

import re

import pytest

from hazards.megakernel_layers import faithful as FA

from .test_gemv_one_round import assert_step_10_loop_and_no_more_spills
from .test_merge_spread import INCLUDE, LAYERED, assert_static_checks_pass_with_the_polls_of, family_cubin, listing_of
from .test_production_step22 import KERNEL, _eval, _switches, switches_changed_from_step_10

KEEP = "createpolicy.fractional.L2::evict_last"
STREAM = "createpolicy.fractional.L2::evict_first"
HINTED_PREFETCH = "cp.async.bulk.prefetch.L2.global.L2::cache_hint"
HINTED_LOAD = "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32"
DEMOTE = "applypriority.global.L2::evict_normal"


def _ptx(defines: dict[str, int] | None, label: str) -> str:
    """The PTX of the family's source built with `defines` (None: production's); build cache."""
    from hazards.engine.errors import ToolchainMissing
    from hazards.static.compile import compile_ptx

    try:
        return compile_ptx(LAYERED, defines=defines, label=label, extra_args=(f"-I{INCLUDE}",)).text
    except ToolchainMissing as e:
        pytest.skip(f"cannot build the family's PTX: {e}")


def _func(ptx: str, name: str) -> str:
    """The body of the PTX function whose mangled name contains `name` (its one definition: a
    declaration ends at its `;`, before any `{`)."""
    bodies = []
    for m in re.finditer(r"\.func[^\n]*" + re.escape(name), ptx):
        rest = ptx[m.start():]
        if rest.index("{") < rest.index(";"):
            bodies.append(rest[:rest.index("\n}\n")])
    assert len(bodies) == 1, (name, len(bodies))
    return bodies[0]


@pytest.fixture(scope="module")
def ptx_prod() -> str:
    return _ptx(None, "test-mkl-ptx-prod")


@pytest.fixture(scope="module")
def ptx_k() -> str:
    return _ptx({"MKL_CAMPAIGN_STEP": 13}, "test-mkl-ptx-13")


def test_production_ptx_has_no_l2_policy(ptx_prod):
    for op in (KEEP, STREAM, HINTED_PREFETCH, HINTED_LOAD, DEMOTE, "L2::cache_hint"):
        assert op not in ptx_prod, op


def test_step_k_gemv_loop_loads_every_weight_evict_first(ptx_k, ptx_prod):
    for depth in (1, 4):
        prod, step = _func(ptx_prod, f"gemv_roundILi{depth}E"), _func(ptx_k, f"gemv_roundILi{depth}E")
        plain = "ld.global.nc.L1::no_allocate.v4.u32"
        assert prod.count(plain) == 4 * depth and HINTED_LOAD not in prod  # GEMV_ROWS x DEPTH a lane
        assert step.count(HINTED_LOAD) == 4 * depth and plain not in step, depth
        assert STREAM in step and KEEP not in step


def test_step_k_keeps_the_next_layer_qkv_evict_last_and_demotes_what_it_read(ptx_k):
    keep = _func(ptx_k, "l2_keep_tiles")
    assert KEEP in keep and HINTED_PREFETCH in keep and DEMOTE in keep and STREAM not in keep
    assert _keep_fractions(keep) == {"0f3F800000"}  # MKL_L2_KEEP_PCT 100: every prefetched line kept
    # nowhere else: the other bulk prefetches (QKV tile, K/V, Wo, router, W13, W2) keep production's form
    assert all(ptx_k.count(op) == keep.count(op) for op in (HINTED_PREFETCH, DEMOTE, KEEP))
    # both kernels (tripwire in and out) call it
    kernels = [k for k in ptx_k.split(".entry ")[1:] if k.startswith("_ZN3mkl14mkl_megakernel")]
    assert len(kernels) == 2 and all(re.search(r"call\.uni[^;]*l2_keep_tiles", k) for k in kernels)


def _keep_fractions(ptx: str) -> set[str]:
    """The f32 constants the keep policies' fraction registers are set to."""
    regs = re.findall(re.escape(KEEP) + r"\.L2::evict_unchanged\.b64\s+%rd\d+,\s*(%f\d+);", ptx)
    assert regs, re.findall(re.escape(KEEP) + r"[^;]*;", ptx)[:2]
    return {re.search(r"mov\.f32\s+" + re.escape(r) + r",\s*(0f[0-9A-F]{8});", ptx).group(1) for r in regs}


def test_step_k_half_keeps_half_the_lines():
    assert _keep_fractions(_ptx({"MKL_CAMPAIGN_STEP": 13, "MKL_L2_KEEP_PCT": 50}, "test-mkl-ptx-13-half")) == \
        {"0f3F000000"}


def test_step_k_sass_has_hinted_prefetches_and_demotions_step_10_none():
    prod = listing_of(family_cubin({"MKL_CAMPAIGN_STEP": 10}, "test-mkl-step-10"))
    step = listing_of(family_cubin({"MKL_CAMPAIGN_STEP": 13}, "test-mkl-step-13"))
    hinted = re.compile(r"UBLKPF\.L2 \[[^\]]+\], [^,;]+, desc\[")
    assert not hinted.search(prod) and "CCTL.E.DML2" not in prod
    assert len(hinted.findall(step)) >= 1 and step.count("CCTL.E.DML2") >= 1
    # the plain bulk prefetches (QKV tile, K/V, Wo, router, W13, W2) are step 10's
    plain = re.compile(r"UBLKPF\.L2 \[[^\]]+\], [^,;]+ ;")
    assert len(plain.findall(step)) == len(plain.findall(prod)) > 0


def test_step_k_keeps_step_10_loop_and_spills_no_more_than_step_10_anywhere():
    assert_step_10_loop_and_no_more_spills({"MKL_CAMPAIGN_STEP": 13}, "test-mkl-step-k-spills",
                                           added=("l2_keep_tiles",))


def test_step_k_passes_the_compiled_static_checks_with_step_10_polls():
    assert_static_checks_pass_with_the_polls_of(13, 10)


def test_step_k_is_step_10_but_for_the_l2_switch_and_a_candidate_of_the_gate():
    c, half, aside = FA.candidate("step_k"), FA.candidate("step_k_half"), FA.candidate("step_k_setaside")
    assert dict(c.defines) == {"MKL_CAMPAIGN_STEP": 13} and c.params == () and c.expected == "slower"  # round 17
    assert dict(half.defines) == {"MKL_CAMPAIGN_STEP": 13, "MKL_L2_KEEP_PCT": 50} and half.params == ()
    assert dict(aside.defines) == {"MKL_CAMPAIGN_STEP": 13, "MKL_L2_SET_ASIDE_MB": 30} and aside.params == ()
    changed, prod, step = switches_changed_from_step_10({"MKL_CAMPAIGN_STEP": 13})
    assert changed == {"MKL_CAMPAIGN_STEP", "MKL_L2_KEEP_QKV"}
    assert step["MKL_L2_KEEP_QKV"] == 1 and step["MKL_W2_QUANT_AHEAD"] == 1 and prod["MKL_L2_KEEP_QKV"] == 0


def test_step_k_variants_say_their_faster_is_an_unmeasured_hypothesis_and_their_base_was_slower():
    """step_k_half and step_k_setaside were never measured (round 17 measured step_k alone: slower than
    step 10): their `expected` is the hypothesis they were written for, which their texts say, with
    their base's verdict; no verdict of their own is claimed."""
    assert FA.candidate("step_k").expected == "slower"
    for name in ("step_k_half", "step_k_setaside"):
        variant = FA.candidate(name)
        assert variant.expected == "faster" and "not measured: 'faster' is the hypothesis" in variant.what, name
        assert "step_k, its base, was slower than step 10 in round 17" in variant.what, name


def test_only_step_k_setaside_asks_the_harness_for_a_persisting_l2_set_aside():
    """The harness's set-aside code is compiled in only where MKL_L2_KEEP_QKV and MKL_L2_SET_ASIDE_MB > 0:
    step_k_setaside, not production nor step_k (their host code is production's)."""
    text = LAYERED.read_text()
    conds = re.findall(r"^#if (.*MKL_L2_SET_ASIDE_MB.*)$", text, re.M)
    assert len(conds) == 2 and "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize" in text
    default = int(re.search(r"#define MKL_L2_SET_ASIDE_MB (\d+)", KERNEL.read_text()).group(1))
    for name, want in (("production", 0), ("step_k", 0), ("step_k_half", 0), ("step_k_setaside", 1)):
        defines = dict(FA.candidate(name).defines)
        env = {**_switches(defines), "MKL_L2_SET_ASIDE_MB": defines.get("MKL_L2_SET_ASIDE_MB", default)}
        assert {_eval(c, env) for c in conds} == {want}, name
