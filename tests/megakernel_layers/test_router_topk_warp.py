"""Campaign step (e) (MKL_CAMPAIGN_STEP 6, candidate step_e, round 9): step (d), then production, with
step (b)'s router folded into the O-projection workers' partial logits and the top-k by one
warp's butterfly instead of one thread's scan.

Round 7's profile (H200) had the router at ~21 us a layer on the one block that every worker's
ROUTING wait is behind, moving ~0.2 MB: latency, not bytes. On the CPU (nvcc 13.0, sm_90a,
nvdisasm): the step (e) build of the family's own source compiles with both the spread merge and
the folded router, its O-projection workers load a warp's experts' router weights in one pass
(step (b)'s: one expert a pass, a warp reduction between), its router tail picks with shuffles
(step (b)'s scans shared memory on one thread), it spills no more than step (b)'s, and the
compiled static checks pass it with step (d)'s polls (folding the router adds no wait). Before
this change MKL_CAMPAIGN_STEP 6 built step 2's kernel (no flag was set) and the script had no
stepe-quick mode: every test here fails there (the first four were run there and failed).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hazards.megakernel_layers import faithful as FA

from .sass_text import function_listings, loop_loads_then_reduces
from .test_merge_spread import _sass, _static


@pytest.fixture(scope="module")
def step_e() -> str:
    return _sass(6)


def test_step_e_merges_with_the_spread_merge_and_routes_from_the_o_projection_partials(step_e):
    funcs = function_listings(step_e, ("merge_heads", "merge_chunks", "router_partials", "router_from_partials",
                                       "router_topk"))
    assert {"merge_heads", "router_partials", "router_from_partials"} <= set(funcs), sorted(funcs)
    assert "router_topk" not in funcs and "merge_chunks" not in funcs, sorted(funcs)


def test_step_e_picks_the_top_k_with_a_warp_butterfly_not_a_thread_scan(step_e):
    """Step (b)'s router_from_partials ends in select_topk on thread 0: K x E dependent shared-
    memory loads (logits[best]) and no shuffle. Step (e)'s picks by 5 butterfly steps a pick
    (value and index) and a broadcast of lane 0's pick."""
    mine = function_listings(step_e, ("router_from_partials",))["router_from_partials"]
    theirs = function_listings(_sass(3), ("router_from_partials",))["router_from_partials"]
    assert not re.search(r"\bSHFL\b", theirs)
    assert len(re.findall(r"\bSHFL\.BFLY\b", mine)) >= 2 * 5, len(re.findall(r"\bSHFL\.BFLY\b", mine))
    assert re.search(r"\bSHFL\.IDX\b", mine)  # lane 0's pick broadcast: every lane marks the same expert
    # the scan's loads of logits[e] and logits[best] are gone: fewer shared loads than step (b)'s
    assert len(re.findall(r"\bLDS\b", mine)) < len(re.findall(r"\bLDS\b", theirs))
    assert len(re.findall(r"\bSTL\b", mine)) <= len(re.findall(r"\bSTL\b", theirs))  # sel[]'s, as step (b)'s


def test_step_e_loads_a_warps_experts_router_weights_in_one_pass_before_any_reduction(step_e):
    """Step (b)'s router_partials loops over a warp's experts: load the expert's weights of the
    worker's rows, reduce across the warp, store, then the next expert's loads (a dependent round
    trip an expert on the O-projection's critical path). Step (e)'s loads every expert of the warp
    in one pass and reduces after it: no loop body loads and then shuffles."""
    weights = r"\bLDG?\S*\.U16\b"  # the bf16 router weights
    assert loop_loads_then_reduces(function_listings(_sass(3), ("router_partials",))["router_partials"], weights)
    mine = function_listings(step_e, ("router_partials",))["router_partials"]
    assert re.search(weights, mine) and not loop_loads_then_reduces(mine, weights)


def test_step_e_passes_the_compiled_static_checks_with_step_d_polls():
    failing, polls = _static(6)
    assert failing == [], [f.message for f in failing]
    _, step_d_polls = _static(5)
    assert polls == step_d_polls  # the folded router adds no wait: its partials ride on the OPROJ arrival


def test_step_e_is_a_candidate_of_the_gate_judged_against_production():
    c = FA.candidate("step_e")
    assert dict(c.defines) == {"MKL_CAMPAIGN_STEP": 6} and c.params == ()
    # against step (d) (round 9) it was faster; production (step 22) is step (e) + step (g) + step (l) + step (m) + step (p) + step (r) + step (t)
    assert c.expected == "slower"


SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "gpu" / "layers-campaign.sh"


def _mode(text: str, name: str) -> str:
    start = text.index(f'elif [ "$WHAT" = {name} ]; then')
    return text[start:text.index("\nelif ", start + 1)]


def test_the_step_e_round_gates_the_candidate_against_production_within_120_s_and_8_files():
    text = SCRIPT.read_text()
    mode = _mode(text, "stepe-quick")
    gates = re.findall(r"gate (\w+) (\w+) (\w+)", mode)
    assert [(base, cand) for _, base, cand in gates] == [("production", "step_e")]
    # the builds it times and compares are the catalog's candidates' builds
    assert f"build step6 \"{{'MKL_CAMPAIGN_STEP': {dict(FA.candidate('step_e').defines)['MKL_CAMPAIGN_STEP']}}}\"" in mode
    assert "build step3 \"{'MKL_CAMPAIGN_STEP': 3}\"" in mode and dict(FA.candidate("step_b").defines) == {
        "MKL_CAMPAIGN_STEP": 3}
    # the bench (production and step (e)), the profile of both, the canaries on step (e)'s build
    assert 'quick_tail 6 step_e "production step_e" MKL_CAMPAIGN_STEP=6' in mode
    assert int(re.search(r'"\$WHAT" = stepe-quick \]; then BUDGET=\$\{BUDGET:-(\d+)\}', text).group(1)) <= 120
    # what lands under $OUT/layers-campaign: the common three, its own two, the tar
    copied = re.search(r'\[ "\$WHAT" = stepe-quick \] && cp (.*) "\$R/"', text).group(1).split()
    common = re.search(r'cp ("\$W/perf.txt" .*) "\$R/" 2>/dev/null\n', text).group(1).split()
    assert len(copied) + len(common) + 1 <= 8
    # none of the tail steps meant for other modes (ragged regression, hang classes, check) runs in it
    for tail in re.findall(r'^if \[ "\$WHAT" != gate \].*$', text, re.M):
        assert '[ "$WHAT" != stepe-quick ]' in tail, tail
