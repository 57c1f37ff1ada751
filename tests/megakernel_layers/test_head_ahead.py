"""Campaign step (h) (MKL_CAMPAIGN_STEP 9, candidate step_h): step (e) with the layer head's loads
issued ahead of their use.

Round 12's profile (H100, production) had the layer head's latency-bound tasks at qkv 26.3 us (369 KB
on each of 80 SMs), attn_chunk 35.4 us (254 KB on each of 33) and oproj 13.7 us (179 KB on each of 132)
a layer. On the CPU (nvcc 13.0, sm_90a, nvdisasm): step (e) runs the QKV tile and the O-projection
through gemv_round<4> (a warp's items one after another, 4 x 32 chunks a pass: QKV 4 passes a warp,
the O-projection 3) after their activations are in shared memory, and its attend_chunk loads a block's
K row in two halves (the second after the first half's FMAs) after the q copy. Step (h)'s
gemv_round_ahead issues a warp's first pass (24 x 16 B a lane) before the activation fill's barrier
(the RMSNorm, the copy of attn_out) and every later pass before its first FMA, spilling nothing; its
attend_chunk loads the warp's first K row before the q copy and every block's whole row before its
first FMA, and spills no K row. No wait is added or moved (the compiled static checks pass with step
(e)'s polls), so no hazard switch moves; the output is step (e)'s bit for bit (the GPU test in
test_gpu.py). Before this change MKL_CAMPAIGN_STEP 9 built step (g)'s kernel (step (f)'s and (g)'s
flags were `>= 7` and `>= 8`): every SASS test here fails there.
"""
from __future__ import annotations

import re

import pytest

from hazards.megakernel_layers import faithful as FA

from .sass_text import function_instances, function_listings, longest_load_run
from .test_attention_ahead import _budget
from .test_merge_spread import _sass, _static
from .test_router_topk_warp import SCRIPT, _mode

WEIGHT_LOAD = r"\bLDG\.E\.NA\.128\.CONSTANT\b"  # a 16-B read-only weight load (ld.global.nc.L1::no_allocate)
K_LOAD = r"\bLDG\.E\.128\.STRONG\.GPU\b"          # a 16-B coherent load: a piece of the lane's token's K row
BARRIER = r"\bBAR\.SYNC\b"
POLL = r"\bLDG\.E\.STRONG\.GPU\b"            # a wait's poll (ld.relaxed.gpu; its acquire fence follows)
PASS_LOADS = 24  # gemv_round_ahead's pass: IPP x ITERS x GEMV_ROWS = 1 x 6 x 4 (QKV) or 3 x 2 x 4 (O-projection)


def _first(lines: list[str], pattern: str) -> int:
    return next(i for i, l in enumerate(lines) if re.search(pattern, l))


def _spilled_loads(body: str, load: str) -> list[str]:
    """The spill stores (STL) whose register was last written by a load matching `load` (a 16-B load
    writes four registers): such a store waits for its load, and the loads issued ahead of it
    serialise again."""
    lines = body.splitlines()
    found = []
    for i, line in enumerate(lines):
        m = re.search(r"\bSTL\S*\s+\[[^\]]+\],\s*R(\d+)", line)
        if not m:
            continue
        reg = int(m.group(1))
        for prev in reversed(lines[:i]):
            d = re.search(r"^\s*(?:/\*\w+\*/)?\s*(?:@!?U?P\w+\s+)?([A-Z][\w.]*)\s+R(\d+)\b", prev)
            if not d:
                continue
            width = 4 if ".128" in d.group(1) else 2 if ".64" in d.group(1) else 1
            if int(d.group(2)) <= reg < int(d.group(2)) + width:
                if re.search(load, prev):
                    found.append(line.strip())
                break
    return found


@pytest.fixture(scope="module")
def step_h() -> str:
    return _sass(9)


@pytest.fixture(scope="module")
def step_e() -> str:
    return _sass(6)


def test_step_e_runs_the_head_gemvs_through_gemv_round_and_loads_k_after_the_q_copy(step_e):
    """The old code's shape, which step (h) changes."""
    assert not function_instances(step_e, "gemv_round_ahead")
    for body in function_instances(step_e, "attend_chunk"):
        lines = body.splitlines()
        assert _first(lines, K_LOAD) > _first(lines, BARRIER)  # the K row waits for the q copy


def test_step_h_issues_a_warps_first_pass_before_the_fill_and_every_pass_before_its_first_fma(step_h):
    """Both pass shapes (QKV's 1 x 6 iterations, the O-projection's 3 items x 2), each with its fill
    (the RMSNorm or the copy of attn_out: a block barrier inside), in both kernels: the 24 loads of the
    first pass go out before the fill's first barrier; a pass's 24 loads go out before any FFMA; no
    spill store of a loaded register."""
    bodies = function_instances(step_h, "gemv_round_ahead")
    names = re.findall(r"^\S*gemv_round_ahead(ILi\d+ELi\d+E)\S*:\s*$", step_h, re.M)
    assert sorted(set(names)) == ["ILi2ELi3E", "ILi6ELi1E"] and len(bodies) == 8, names
    for body in bodies:
        lines = body.splitlines()
        before_fill = [l for l in lines[:_first(lines, BARRIER)] if re.search(WEIGHT_LOAD, l)]
        assert len(before_fill) == PASS_LOADS, len(before_fill)
        assert longest_load_run(body, WEIGHT_LOAD) >= PASS_LOADS
        assert _spilled_loads(body, WEIGHT_LOAD) == []
        assert not re.search(POLL, body)  # the waits stay in the kernel body, where the static checks see them


def test_step_h_attention_loads_the_first_k_row_before_the_q_copy_and_each_row_whole(step_h):
    """attend_chunk (two shapes x two kernels): the lane's first K row (8 x 16 B) goes out before the
    q copy's loads and barrier; in the block loop all 8 pieces go out before the block's first FFMA;
    no K row is spilled (no 16-B spill store) and no spill store sits between a block's K loads and its
    first FFMA."""
    bodies = function_instances(step_h, "attend_chunk")
    assert len(bodies) == 4, len(bodies)
    for body in bodies:
        lines = body.splitlines()
        bar = _first(lines, BARRIER)
        ahead = [i for i, l in enumerate(lines[:bar]) if re.search(K_LOAD, l)]
        q_copy = _first(lines, r"\bLDG?\.E\s")  # a 32-bit load of the queries (generic in the harness build)
        assert len(ahead) == 8 and max(ahead) < q_copy, (ahead, q_copy)
        loop = lines[bar:]
        k0 = _first(loop, K_LOAD)
        first_ffma = k0 + _first(loop[k0:], r"\bFFMA\b")
        assert len([l for l in loop[k0:first_ffma] if re.search(K_LOAD, l)]) == 8
        assert not any(re.search(r"\bSTL\b", l) for l in loop[k0:first_ffma])
        assert _spilled_loads(body, K_LOAD) == []


def test_spilled_loads_finds_the_spill_stores_of_loaded_registers_in_step_f_quantization():
    """The helper the two tests above rely on, on code known to spill its loads: step (f)'s
    quantize_expert_input stores each 16-B load's register to the stack (test_w2_quant_ahead.py)."""
    for body in function_instances(_sass(7), "quantize_expert_input"):
        assert len(_spilled_loads(body, K_LOAD)) >= 5


def test_step_h_keeps_step_e_tasks_and_none_of_steps_f_and_g():
    funcs = function_listings(_sass(9), ("merge_heads", "merge_chunks", "router_partials", "router_from_partials",
                                         "router_topk", "attend_chunk", "quantize_expert_input",
                                         "quantize_expert_rounds"))
    assert {"merge_heads", "router_partials", "router_from_partials", "quantize_expert_input"} <= set(funcs)
    assert not {"router_topk", "merge_chunks", "quantize_expert_rounds"} & set(funcs), sorted(funcs)
    assert not re.search(r"\bLDGSTS\b", funcs["attend_chunk"])  # no step (f) copies


def test_step_h_passes_the_compiled_static_checks_with_step_e_polls():
    failing, polls = _static(9)
    assert failing == [], [f.message for f in failing]
    _, step_e_polls = _static(6)
    assert polls == step_e_polls  # no wait added or moved: the loads ahead sit behind the same acquires


def test_step_h_is_a_candidate_of_the_gate():
    c = FA.candidate("step_h")
    assert dict(c.defines) == {"MKL_CAMPAIGN_STEP": 9} and c.params == ()
    assert c.expected == "slower"  # slower than step (e) in round 13; production (step 22) is step (e) + (g) + (l) + (m) + (p) + (r) + (t)


def test_the_step_h_round_gates_step_h_against_step_e_and_compares_bits_clean_and_with_stale_descriptor():
    text = SCRIPT.read_text()
    mode = _mode(text, "steph-quick")
    assert [(b, c) for _, b, c in re.findall(r"gate (\w+) (\w+) (\w+)", mode)] == [("step_e", "step_h")]
    for name in ("step_e", "step_h"):  # the builds it compares are the gate's candidates' builds
        step = dict(FA.candidate(name).defines)["MKL_CAMPAIGN_STEP"]
        assert f"build step{step} \"{{'MKL_CAMPAIGN_STEP': {step}}}\"" in mode
    assert 'same_bits step6 step9 "step (e)" "step (h)" stale_descriptor' in mode  # clean and with the switch on
    assert 'quick_tail 9 step_h "step_e step_h" MKL_CAMPAIGN_STEP=6 MKL_CAMPAIGN_STEP=9' in mode
    assert _budget(text, "steph-quick") <= 120
    assert re.search(r'for j in \$\(jobs -p\); do wait "\$j"; done', mode)
    for tail in re.findall(r'^if \[ "\$WHAT" != gate \].*$', text, re.M):  # no tail step of other modes
        assert '[ "$WHAT" != steph-quick ]' in tail, tail
    header = text[:text.index("set -u")]
    assert "layers-campaign.sh steph-quick" in header and "`steph-quick`" in header
    # the returned files: the common three, perf.json, both gates' JSON, the tar (<= 8)
    copied = re.search(r'\[ "\$WHAT" = steph-quick \] && cp (.*) "\$R/"', text).group(1).split()
    assert copied == ['"$W/perf.json"', '"$W"/gate_eh*.json']


def test_the_final_gpu_suite_prebuilds_step_h():
    """test_gpu.py's step (h) bits test builds MKL_CAMPAIGN_STEP 9; inside pytest a build takes 10-16 s."""
    text = (SCRIPT.parent / "final-gpu-tests.sh").read_text()
    assert '{"MKL_CAMPAIGN_STEP": 9}' in text
