"""ci/gpu/layers-campaign.sh's `promote` mode (round 8; step 10's since promote10; the previous production
named by PREV, PREV_STEP and SAME_STEP since the tenth session; SAME_STEP none in promote15, whose
production kept no earlier step's bits; 15 in promote18 and promote21, whose productions kept step 15's; none
again since promote22, whose production (step 22: step (t)'s merge in another sum order) keeps no earlier step's)
read on the CPU:
the shell parses, it gates the previous production (PREV) against production both ways and runs
the family check on production's build, it compares production's output with the step whose bits it
keeps (or, with none, says so and judges closeness to PREV's alone), and the snapshot_epoch skews it
runs sit where the model says they should (below the promoted production's layer head: clean; above
it: a hang)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hazards.families import megakernel_layers as F
from hazards.megakernel_layers import faithful as FA

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "gpu" / "layers-campaign.sh"


def _promote_mode() -> str:
    text = SCRIPT.read_text()
    start = text.index('elif [ "$WHAT" = promote ]; then')
    return text[start:text.index("\nelif ", start + 1)]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_campaign_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def _previous_production(mode: str) -> tuple[str, int, int | None]:
    """The mode's defaults: the previous production's candidate, its step, and the step whose bits
    production must have (PREV, PREV_STEP, SAME_STEP; None where SAME_STEP is none: no step's bits)."""
    m = re.search(r"^PREV=\$\{PREV:-(\w+)\}; PREV_STEP=\$\{PREV_STEP:-(\d+)\}; SAME_STEP=\$\{SAME_STEP:-(\d+|none)\}$",
                  mode, re.M)
    assert m, "the promote mode names no previous production"
    return m.group(1), int(m.group(2)), None if m.group(3) == "none" else int(m.group(3))


def test_the_promotion_gates_the_previous_production_both_ways():
    """The promotion judges the previous production (PREV, a catalog candidate built at PREV_STEP)
    against production both ways, and runs the checked launches, the bench and the profile on its
    build, not an older production's."""
    mode = _promote_mode()
    prev, prev_step, _ = _previous_production(mode)
    gates = re.findall(r'^gate (\w+) ("\$PREV"|\w+) ("\$PREV"|\w+)$', mode, re.M)
    assert {(base, cand) for _, base, cand in gates} == {('"$PREV"', "production"), ("production", '"$PREV"')}
    assert dict(FA.candidate(prev).defines) == {"MKL_CAMPAIGN_STEP": prev_step}
    assert FA.candidate(prev).expected == "slower"  # production is expected faster
    assert "build prev \"{'MKL_CAMPAIGN_STEP': $PREV_STEP}\"" in mode
    assert "build profprev \"{'HZ_PROFILER': 1, 'MKL_CAMPAIGN_STEP': $PREV_STEP}\"" in mode
    assert re.search(r"^  checked plain prev$", mode, re.M) and re.search(r"^  checked plain prev same$", mode, re.M)
    assert 'compare_dumps plain prev "production vs $PREV"' in mode
    assert "megakernel_layers_perf.py --also-define MKL_CAMPAIGN_STEP=$PREV_STEP " in mode
    assert '--candidate production --candidate "$PREV" ' in mode
    assert "step_b0" not in mode and "MKL_CAMPAIGN_STEP': 2" not in mode


def test_the_promotion_compares_productions_bits_with_the_step_it_keeps_the_bits_of():
    """With SAME_STEP a step: its build, and production's dump against its dump bit for bit (step 21: step
    15's bits, PREV's). With none (step 15's promotion: the attention on tensor cores summed in another
    order than every earlier step; step 22's: the merge split over a block's warps, another order than step
    21's): neither the build nor the check, the console says why, and production's closeness to PREV is what
    is judged."""
    mode = _promote_mode()
    prev, prev_step, same = _previous_production(mode)
    assert 'cmp -s "$W/dump_plain.f32" "$W/dump_same.f32"' in mode
    assert "[ \"$SAME_STEP\" = none ] || build same \"{'MKL_CAMPAIGN_STEP': $SAME_STEP}\" &" in mode
    assert "production: no earlier step's bits to keep (SAME_STEP=none" in mode  # the none branch stays
    if same is None:
        # step 22's promotion (promote22): no earlier step has its bits (step 21's, PREV's, are step 15's; step
        # (t)'s merge sums in another order); round 20's step 15 was the same case over step_14
        assert (prev, prev_step) == ("step_21", 21)
        assert "not production's" in FA.candidate(prev).what
    else:
        assert any(dict(c.defines) == {"MKL_CAMPAIGN_STEP": same} for c in FA.CANDIDATES.values())
        # step 21's promotion (promote21: step 15 + step (p) + step (r), the same sums in the same order, other
        # fences): PREV's bits
        assert (prev, prev_step, same) == ("step_15", 15, 15)
        assert "production's bits" in FA.candidate(prev).what
    # the defaults name the production the catalog says production replaced
    assert "(the previous production)" in FA.candidate(prev).what
    # the none branch runs no `same` launches, the other compares them
    start = mode.index('if [ "$SAME_STEP" = none ]; then')
    none_branch = mode[start:mode.index("\nelse\n", start)]
    assert "checked plain prev same" not in none_branch and "cmp -s" not in none_branch


def test_the_promotion_runs_the_family_check_on_production_in_both_forms():
    """The promotion rule's item 4 (docs/gates.md): `hazards check --families megakernel_layers` on the
    new production. Round 13 could not run it for step_g_on_e; the promote mode now does, lean or not,
    after the gate PREV -> production and before the logit gate."""
    mode = _promote_mode()
    body = mode[mode.index("p_check() {"):mode.index("\n}\n", mode.index("p_check() {"))]
    assert "python3 -m hazards check --families megakernel_layers --skip clang" in body
    assert '--budget "${cb}s"' in body and "--binary" not in body  # the family's default build: production
    start = mode.index('\nif [ "${LEAN:-0}" = 1 ]; then\n')
    lean, full = mode[start:mode.index('\ngate q production "$PREV"\n')], mode.split('\ngate q production "$PREV"\n', 1)[1]
    assert re.search(r"^  p_check \d+$", lean, re.M)
    assert re.search(r"^p_check \d+$", full, re.M)
    assert mode.index('\ngate p "$PREV" production\n') < mode.index("\n  p_check ") < mode.index("layers-logit-gate.sh")


def test_the_promotion_gates_wait_for_the_torch_compile_warm_up_that_shares_the_gpu():
    """The warm-up runs torch on the GPU in the background; a gate timed beside it has its
    launches time-sliced with that process's. The gates start once it has ended (or say they
    share the GPU with it)."""
    mode = _promote_mode()
    before_gates = mode[:mode.index("\ngate p ")]
    assert re.search(r'for _ in \$\(seq \d+\); do kill -0 "\$WARM" 2>/dev/null \|\| break; sleep 1; done', before_gates)
    assert 'kill -0 "$WARM" 2>/dev/null && log "the torch.compile warm-up is still running' in before_gates


def test_the_snapshot_skews_of_the_promotion_round_straddle_the_models_layer_head():
    [points] = re.findall(r"for point in ((?:\d+:\d+:\d+ ?)+); do", _promote_mode())
    calls = {}
    for point in points.split():
        us, cycles, runs = map(int, point.split(":"))
        assert abs(cycles / (F.CLOCK_GHZ * 1e3) - us) < 1, point  # the label says the skew it runs
        assert runs >= 10
        calls[us] = F.predict({"variant": "snapshot_epoch", "jitter_cycles": cycles}).probability
    below = [us for us in calls if us < F.LAYER_HEAD_US]
    above = [us for us in calls if us > F.LAYER_HEAD_US]
    assert below and above, calls
    assert all(calls[us] == 0 for us in below) and all(calls[us] > 0 for us in above), calls
    # the point just above the head is within 15 us of it: where a head longer than measured shows
    assert min(above) - F.LAYER_HEAD_US < 15, calls


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_compare_dumps_prints_cos_and_largest_difference_of_two_builds_outputs(tmp_path):
    """The promotion's production-vs-step_d line (and stepc's candidate line), run on made-up dumps:
    a dump is (output, the binary's reference), and only the outputs are compared."""
    from array import array

    text = SCRIPT.read_text()
    func = text[text.index("compare_dumps() {"):text.index("\n}\n", text.index("compare_dumps() {")) + 3]
    (tmp_path / "dump_plain.f32").write_bytes(array("f", [1.0, 2.0, 3.0, 9.0, 9.0, 9.0]).tobytes())
    (tmp_path / "dump_step5.f32").write_bytes(array("f", [1.0, 2.0, 3.5, 0.0, 0.0, 0.0]).tobytes())
    script = f'W={tmp_path}\n{func}\ncompare_dumps plain step5 "production vs step_d"\ncompare_dumps plain step6 x\n'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith("production vs step_d: 3 / 3 floats, identical False, cos 0.99"), out
    assert out[0].endswith("max abs diff 0.5"), out
    assert out[1] == "x: no dump to compare", out
