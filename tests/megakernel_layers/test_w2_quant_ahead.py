"""Campaign step (g) (MKL_CAMPAIGN_STEP 8, candidate step_g, round 11): step (f) with W2's FP8
quantization spread over 8 warps, every load of a warp's rounds issued before its first amax.

On the CPU (nvcc 13.0, sm_90a, nvdisasm): step (f)'s (and production's) quantize_expert_input keeps
the lane's 32 values in local memory (ptxas: 128 B of spill stores; the loads are predicated on the
lane's sub-block running), and each 16-B load's register is stored to the stack before the next
load reuses it: ~7 dependent L2 round trips a round, 3 rounds on each of 4 warps before every W2
worker's GEMV. Step (g)'s quantize_expert_rounds loads a clamped sub-block (never predicated),
keeps its values in registers and issues all of a warp's loads (8 or 16 a lane) before any
shuffle: one round trip. The tail round keeps its warp (and the reused register) with the round
before it, so the amax_tail switch reads the same stale packed codes (the GPU test in test_gpu.py
compares both builds' outputs clean and with amax_tail on). Before this change MKL_CAMPAIGN_STEP 8
built step (f)'s kernel (no flag was set): the SASS tests fail there.
"""
from __future__ import annotations

import re

import pytest

from hazards.megakernel_layers import faithful as FA

from .sass_text import function_instances, function_listings
from .test_attention_ahead import _budget
from .test_merge_spread import _sass, _static
from .test_router_topk_warp import SCRIPT, _mode

LOAD = r"\bLDG\.E\.128\.STRONG\.GPU\b"  # a 16-B coherent (ld.global.cg) load of the SwiGLU output


@pytest.fixture(scope="module")
def step_f() -> str:
    return _sass(7)


@pytest.fixture(scope="module")
def step_g() -> str:
    return _sass(8)


def _loads_between_spills(body: str) -> int:
    """How many of the body's SwiGLU loads come after a spill store of an earlier load's register
    and before the next shuffle (each such load waited for the one before it)."""
    seen_store = False
    after = 0
    for line in body.splitlines():
        if re.search(r"\bSTL\b", line):
            seen_store = True
        elif re.search(LOAD, line) and seen_store:
            after += 1
        elif re.search(r"\bSHFL\b", line):
            break
    return after


def test_step_f_quantization_stores_each_load_to_the_stack_before_the_next(step_f):
    """The old code's shape, which step (g) changes: one warp per expert slot runs every round,
    and within a round the loads are serialised by spill stores."""
    bodies = function_instances(step_f, "quantize_expert_input")
    assert len(bodies) == 2, len(bodies)  # the kernel with the tripwire compiled in and out
    for body in bodies:
        assert _loads_between_spills(body) >= 5, _loads_between_spills(body)
    assert not function_instances(step_f, "quantize_expert_rounds")


def test_step_g_issues_every_load_of_a_warps_rounds_before_its_first_shuffle(step_g):
    """One dependent L2 round trip a warp: 8 loads a lane for one round, 16 for the tail pair, all
    before the first SHFL (the amax butterfly), and no local memory at all."""
    one = [b for b in function_instances(step_g, "quantize_expert_rounds") if b]
    funcs = function_listings(step_g, ("quantize_expert_roundsILi1", "quantize_expert_roundsILi2",
                                       "quantize_expert_input"))
    assert "quantize_expert_input" not in funcs, sorted(funcs)
    assert len(one) == 4, len(one)  # <1> and <2>, in both kernels
    for n, want in (("quantize_expert_roundsILi1", 8), ("quantize_expert_roundsILi2", 16)):
        for body in function_instances(step_g, n):
            lines = body.splitlines()
            first_shfl = next(i for i, l in enumerate(lines) if re.search(r"\bSHFL\b", l))
            loads = [i for i, l in enumerate(lines) if re.search(LOAD, l)]
            assert len(loads) == want and max(loads) < first_shfl, (n, loads, first_shfl)
            assert not any(re.search(r"\b(?:STL|LDL)\b", l) for l in lines), n
            assert not any(re.search(r"@!?U?P\d+\s+LDG", l) for l in lines), n  # no predicated load


def test_step_g_keeps_step_f_tasks_but_the_quantization(step_g):
    funcs = function_listings(step_g, ("merge_heads", "router_partials", "router_from_partials", "attend_chunk",
                                       "router_topk", "merge_chunks"))
    assert {"merge_heads", "router_partials", "router_from_partials", "attend_chunk"} <= set(funcs), sorted(funcs)
    assert "router_topk" not in funcs and "merge_chunks" not in funcs, sorted(funcs)
    assert re.search(r"\bLDGSTS\b", funcs["attend_chunk"])  # step (f)'s V copies


def test_step_g_passes_the_compiled_static_checks_with_step_f_polls():
    failing, polls = _static(8)
    assert failing == [], [f.message for f in failing]
    _, step_f_polls = _static(7)
    assert polls == step_f_polls  # no wait added or moved: the W13 release acquire covers the loads


def test_step_g_is_a_candidate_of_the_gate():
    c = FA.candidate("step_g")
    assert dict(c.defines) == {"MKL_CAMPAIGN_STEP": 8} and c.params == ()
    # step 10 with step (f)'s copies (no-change against it on the launch); production is step 10 + step (l)
    assert c.expected == "slower"


def test_the_step_g_round_gates_step_g_against_step_f_and_compares_bits_clean_and_with_amax_tail():
    text = SCRIPT.read_text()
    mode = _mode(text, "stepg-quick")
    assert [(b, c) for _, b, c in re.findall(r"gate (\w+) (\w+) (\w+)", mode)] == [("step_f", "step_g")]
    for name in ("step_f", "step_g"):  # the builds it compares are the gate's candidates' builds
        step = dict(FA.candidate(name).defines)["MKL_CAMPAIGN_STEP"]
        assert f"build step{step} \"{{'MKL_CAMPAIGN_STEP': {step}}}\"" in mode
    assert 'same_bits step7 step8 "step (f)" "step (g)" amax_tail' in mode  # clean and with amax_tail on
    assert 'quick_tail 8 step_g "step_f step_g" MKL_CAMPAIGN_STEP=7 MKL_CAMPAIGN_STEP=8' in mode
    assert _budget(text, "stepg-quick") <= 120
    assert re.search(r'for j in \$\(jobs -p\); do wait "\$j"; done', mode)
    for tail in re.findall(r'^if \[ "\$WHAT" != gate \].*$', text, re.M):  # no tail step of other modes
        assert '[ "$WHAT" != stepg-quick ]' in tail, tail


def test_checked_with_a_hazard_writes_its_own_dump_beside_the_clean_one():
    text = SCRIPT.read_text()
    body = text[text.index("checked() {"):text.index("\n}\n", text.index("checked() {"))]
    assert '--dump "$W/dump_$b$tag.f32"' in body and '"$W/sanity_$b$tag.txt"' in body
    assert 'params="{\\"hazard\\":\\"$hz\\"}"' in body


def test_same_bits_checks_both_builds_clean_and_with_the_hazard_and_compares_each_pair_of_dumps():
    text = SCRIPT.read_text()
    body = text[text.index("same_bits() {"):text.index("\n}\n", text.index("same_bits() {"))]
    assert 'checked "$base" "$cand"' in body and 'CHECKED_HAZARD=$5 checked "$base" "$cand"' in body
    assert 'for tag in "" "_$5"; do' in body
    assert 'cmp -s "$W/dump_$base$tag.f32" "$W/dump_$cand$tag.f32"' in body


def test_step_g_on_e_is_step_g_quantization_without_step_f_attention_copies():
    """Round 12 judged step (f) no-change on the launch, and step (g) only on top of it: the
    candidate step_g_on_e (MKL_ATTN_AHEAD 0) builds step (g)'s quantization on step (e), so its
    gain can be judged where step (f) is not promoted."""
    from .test_merge_spread import family_cubin, listing_of

    c = FA.candidate("step_g_on_e")
    assert dict(c.defines) == {"MKL_CAMPAIGN_STEP": 8, "MKL_ATTN_AHEAD": 0}
    assert c.expected == "slower"  # step 10's code (test_production_step22.py), production's until step 14
    sass = listing_of(family_cubin(dict(c.defines), "test-mkl-step-g-on-e"))
    funcs = function_listings(sass, ("attend_chunk", "quantize_expert_input", "router_partials"))
    assert "router_partials" in funcs  # step (e)'s router
    assert not re.search(r"\bLDGSTS\b", funcs["attend_chunk"])  # no step (f) copies
    assert "quantize_expert_input" not in funcs  # step (g)'s quantization replaced the old function
    assert len([b for b in function_instances(sass, "quantize_expert_rounds") if b]) == 4  # <1>, <2>; both kernels
