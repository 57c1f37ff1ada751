"""Campaign step (f) (MKL_CAMPAIGN_STEP 7, candidate step_f, round 10): step (e) with each
attention block's V rows copied to shared memory by cp.async as the block starts, beside its whole
K row, instead of loaded into registers after the scores.

Round 7's profile (H200) had the attention chunk at ~32 us a layer on 33 SMs for 8.4 MB (the
longest task of the layer head, HBM idle meanwhile), and round 7's gate of 64-token chunks put a
32-token block at ~8 us of it. On the CPU (nvcc 13.0, sm_90a, nvdisasm): production's (and step
(e)'s) attend_chunk issues a block's K row in two halves, the second after the first half's FFMAs,
and its 32 V words one by one after the scores: three dependent L2 round trips a block. Step
(f)'s build issues the whole K row and the V rows' copies (LDGSTS) before the block's first FFMA
and loads no V word into a register: one round trip a block; its compiled static checks pass with step (e)'s polls (no wait added or moved), and the
output is step (e)'s bit for bit (the GPU test in test_gpu.py). Before this change
MKL_CAMPAIGN_STEP 7 built step 2's kernel (no flag was set): the SASS tests fail there.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from hazards.megakernel_layers import faithful as FA

from .sass_text import function_instances, function_listings
from .test_merge_spread import _sass, _static
from .test_router_topk_warp import SCRIPT, _mode

V_WORD_LOAD = r"\bLDG\.E\.(?:EF\.)?STRONG\.GPU\b"  # a 32-bit coherent (ld.global.cg) load: one V word
K_LOAD = r"\bLDG\.E\.128\.STRONG\.GPU\b"           # a 16-B piece of the lane's token's K row


def _block_loop(body: str) -> list[str]:
    """The instructions from a block's first K load on (the q copy before it is the chunk's)."""
    lines = body.splitlines()
    start = next(i for i, l in enumerate(lines) if re.search(K_LOAD, l))
    return lines[start:]


@pytest.fixture(scope="module")
def step_f() -> str:
    return _sass(7)


@pytest.fixture(scope="module")
def step_e() -> str:
    return _sass(6)


def test_step_e_splits_a_blocks_k_row_and_loads_its_v_words_after_the_scores(step_e):
    """The old code's shape, which step (f) changes: half of the K row before the first FFMA, and
    32 single-word V loads an instance, the first of them after FFMAs of the block (the scores)."""
    bodies = function_instances(step_e, "attend_chunk")
    assert len(bodies) == 4, len(bodies)  # two shapes x two kernels (tripwire in and out)
    for body in bodies:
        loop = _block_loop(body)
        first_ffma = next(i for i, l in enumerate(loop) if re.search(r"\bFFMA\b", l))
        assert len([l for l in loop[:first_ffma] if re.search(K_LOAD, l)]) < 8
        assert len([l for l in loop if re.search(V_WORD_LOAD, l)]) >= 32
        first_v = next(i for i, l in enumerate(loop) if re.search(V_WORD_LOAD, l))
        assert any(re.search(r"\bFFMA\b", l) for l in loop[:first_v])
        assert not re.search(r"\bLDGSTS\b", body)


def test_step_f_issues_a_blocks_whole_k_row_and_v_copies_before_its_first_fma(step_f):
    """One dependent L2 round trip a block: the 8 pieces of the lane's K row and its 8 V copies go
    out before any FFMA of the block, and no V word is loaded into a register."""
    bodies = function_instances(step_f, "attend_chunk")
    assert len(bodies) == 4, len(bodies)
    for body in bodies:
        loop = _block_loop(body)
        first_ffma = next(i for i, l in enumerate(loop) if re.search(r"\bFFMA\b", l))
        copies = [i for i, l in enumerate(loop) if re.search(r"\bLDGSTS\b", l)]
        assert len(copies) >= 8 and max(copies) < first_ffma, (copies, first_ffma)  # 8 x 16 B a lane
        assert len([l for l in loop[:first_ffma] if re.search(K_LOAD, l)]) == 8
        assert not any(re.search(V_WORD_LOAD, l) for l in loop)
        # the block waits for its copies once, after the scores (LDGDEPBAR then DEPBAR), not per token
        assert len(re.findall(r"\bDEPBAR\b", body)) == 1, re.findall(r"\bDEPBAR\S*", body)
        # no spill store between the block's first load and its first FFMA (a store of a register
        # that a load fills waits for the load: the loads ahead would serialise again)
        assert not any(re.search(r"\bSTL\b", l) for l in loop[:first_ffma])


def test_step_f_keeps_step_e_tasks_but_the_attention():
    """Step (f) is step (e) plus the attention change: the spread merge, the folded router and the
    warp's top-k are there, the one-block merge and router are not."""
    funcs = function_listings(_sass(7), ("merge_heads", "merge_chunks", "router_partials",
                                         "router_from_partials", "router_topk"))
    assert {"merge_heads", "router_partials", "router_from_partials"} <= set(funcs), sorted(funcs)
    assert "router_topk" not in funcs and "merge_chunks" not in funcs, sorted(funcs)


def test_step_f_passes_the_compiled_static_checks_with_step_e_polls():
    failing, polls = _static(7)
    assert failing == [], [f.message for f in failing]
    _, step_e_polls = _static(6)
    assert polls == step_e_polls  # the copies add no wait: the chunk's QKV_EPOCH acquire covers them


def test_step_f_is_a_candidate_of_the_gate():
    c = FA.candidate("step_f")
    assert dict(c.defines) == {"MKL_CAMPAIGN_STEP": 7} and c.params == ()
    assert c.expected == "slower"  # against production (step 22: step (e) + step (g) + step (l) + step (m) + step (p) + step (r) + step (t)); no-change over step_e


def _budget(text: str, name: str) -> int:
    return int(re.search(rf'"\$WHAT" = {name} \]; then BUDGET=\$\{{BUDGET:-(\d+)\}}', text).group(1))


def test_the_step_f_round_gates_step_f_against_step_e_on_the_catalogs_builds_within_125_s():
    text = SCRIPT.read_text()
    mode = _mode(text, "stepf-quick")
    assert [(b, c) for _, b, c in re.findall(r"gate (\w+) (\w+) (\w+)", mode)] == [("step_e", "step_f")]
    for name in ("step_e", "step_f"):  # the builds it compares are the gate's candidates' builds
        step = dict(FA.candidate(name).defines)["MKL_CAMPAIGN_STEP"]
        assert f"build step{step} \"{{'MKL_CAMPAIGN_STEP': {step}}}\"" in mode
    # the bench (production, step (e), step (f)), the profile of both, the canaries on step (f)'s build
    assert 'quick_tail 7 step_f "step_e step_f" MKL_CAMPAIGN_STEP=6 MKL_CAMPAIGN_STEP=7 ' in mode
    assert 'cmp -s "$W/dump_step6.f32" "$W/dump_step7.f32"' in mode  # the same bits, said either way
    assert _budget(text, "stepf-quick") <= 125
    copied = re.search(r'\[ "\$WHAT" = stepf-quick \] && cp (.*) "\$R/"', text).group(1).split()
    common = re.search(r'cp ("\$W/perf.txt" .*) "\$R/" 2>/dev/null\n', text).group(1).split()
    assert len(copied) + len(common) + 1 <= 8
    for tail in re.findall(r'^if \[ "\$WHAT" != gate \].*$', text, re.M):  # no tail step of other modes
        assert '[ "$WHAT" != stepf-quick ]' in tail and '[ "$WHAT" != round10 ]' in tail, tail


def test_no_mode_waits_with_a_bare_wait():
    """The script's output goes through `exec > >(tee console.log)`: bash (5.2) counts that process
    substitution among the children a bare `wait` waits for, and tee ends only when the script does,
    so a bare `wait` never returns (stepe-quick's builds did: the round would have been lost to its
    timeout). Every mode waits for its jobs by id."""
    text = SCRIPT.read_text()
    assert "exec > >(tee" in text
    assert not re.findall(r"^\s*wait\s*(?:#.*)?$", text, re.M)
    assert re.search(r'for j in \$\(jobs -p\); do wait "\$j"; done', _mode(text, "stepe-quick"))
    assert re.search(r'for j in \$\(jobs -p\); do wait "\$j"; done', _mode(text, "stepf-quick"))


def test_the_quick_rounds_tail_benches_profiles_and_runs_the_canaries_on_the_candidates_build():
    """quick_tail STEP NAME PROFILED DEFINE...: one --also-define a DEFINE for the bench, one
    --candidate a profiled name, the acceptance bench on MKL_CAMPAIGN_STEP STEP's build."""
    text = SCRIPT.read_text()
    body = text[text.index("quick_tail() {"):text.index("\n}\n", text.index("quick_tail() {"))]
    assert 'also+=(--also-define "$d")' in body and 'cands+=(--candidate "$c")' in body
    assert 'megakernel_layers_perf.py "${also[@]}" --no-torch' in body
    assert 'megakernel_layers_profile.py "${cands[@]}"' in body
    assert 'megakernel_layers_acceptance.py --define "MKL_CAMPAIGN_STEP=$step"' in body


def test_round10_runs_promote_stepe_and_stepf_in_one_call_under_480_s():
    """The next session's one device call (the lead's share of the device: <= 480 s): each mode is
    a mode of the script, their budgets add up inside round10's, round10's inside 480 s with the
    final tar's slack, and what lands under $OUT/layers-campaign stays within 8 files."""
    text = SCRIPT.read_text()
    mode = _mode(text, "round10")
    specs = re.search(r"for spec in ([\w:\- ]+); do", mode).group(1).split()
    modes = [s.split(":")[0] for s in specs]
    assert modes == ["promote", "stepe-quick", "stepf-quick"]
    for m in modes:
        assert f'elif [ "$WHAT" = {m} ]; then' in text
        assert _budget(text, m) >= int(next(s for s in specs if s.startswith(m + ":")).split(":")[1])
    total = _budget(text, "round10")
    assert sum(int(s.split(":")[1]) for s in specs) <= total - 20  # the runs' own starts and the summary
    assert total + 15 <= 480
    # each run gets its own folder, promote its lean form, and is killed past its budget
    assert 'LEAN=1 OUT="$W/$MODE" BUDGET=$B timeout $(( B + 10 ))' in mode
    assert all(f'"{m}"' in mode for m in modes)
    copied = re.search(r'\[ "\$WHAT" = round10 \] && cp (.*) "\$R/"', text).group(1).split()
    common = re.search(r'cp ("\$W/perf.txt" .*) "\$R/" 2>/dev/null\n', text).group(1).split()
    assert copied == ['"$W/summary.txt"', '"$W"/console_*.log']
    assert len(common) + 1 + len(modes) + 1 <= 8  # common three, summary, three consoles, the tar


def test_lean_promote_keeps_what_the_promotion_needs_and_drops_what_round_7_or_another_call_has():
    """LEAN=1 (round10's promote): the gate PREV (the previous production) -> production, the bench, the profile, the family
    check and snapshot_epoch at the three skews stay unconditional; the reverse gate, the canaries and hang
    classes (round 7 ran them on step (d)'s build), the tripwire overhead bench and the ragged
    regression sit behind LEAN, and the header says what lean drops."""
    text = SCRIPT.read_text()
    mode = _mode(text, "promote")
    lean = re.findall(r'if \[ "\$\{LEAN:-0\}" = 1 \]; then(.*?)(?:\nfi\n|; fi\n)', mode, re.S)
    guarded = "".join(lean)
    for dropped in ('gate q production "$PREV"', "megakernel_layers_acceptance.py", "layers-hang-sentences.sh",
                    "tripwire_overhead.py --rounds", "ragged_decode_h200.py"):
        assert dropped in guarded, dropped
    for kept in ('gate p "$PREV" production', "megakernel_layers_profile.py", "hazards check --families", "for point in 25:50000:10 70:138600:16 "
                 "101:200000:10", "layers-logit-gate.sh"):
        assert kept in mode and kept not in guarded, kept
    # lean runs what the promotion needs first: production's head, snapshot_epoch on it, then the bench
    then = guarded[:guarded.index("\nelse\n")]
    assert then.index("p_profile") < then.index("p_snapshot 25") < then.index("p_bench 15"), then
    header = text[:text.index("set -u")]
    assert "LEAN=1 (set by round10) drops" in header


def test_round10_summary_says_per_mode_what_its_console_says_and_what_did_not_run(tmp_path):
    """The summary (round10's inline Python, run here on made-up consoles): each mode's kept lines
    under its name, a mode without a console said so, what ran.txt says first."""
    import subprocess
    import sys

    text = SCRIPT.read_text()
    code = re.search(r"python3 - \"\$W\" <<'EOF2' .*summary\.txt\"\n(.*?)\nEOF2\n", text, re.S).group(1)
    (tmp_path / "ran.txt").write_text("promote: exit 0, 280s into the call\nstepf-quick: not run (20s left)\n")
    (tmp_path / "console_promote.log").write_text(
        "== [3s] builds\nproduction (step (d)): the same bits as step_b0\nunrelated line\n"
        "megakernel_layers:step_b0 -> faster | slowCTA ratios {}\ncanary amax_tail 420/420 launches mismatched\n")
    (tmp_path / "console_stepe-quick.log").write_text("step (e) vs step (b): 5760 / 5760 floats, identical True\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert out.index("promote: exit 0") < out.index("==== promote") < out.index("the same bits as step_b0")
    assert "-> faster" in out and "canary amax_tail" in out and "unrelated line" not in out
    assert out.index("==== stepe-quick") < out.index("identical True") < out.index("==== stepf-quick")
    assert out.rstrip().endswith("(no console: not run)")
