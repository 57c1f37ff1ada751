"""ci/gpu/layers-campaign.sh's `promote` mode (round 8) read on the CPU: the shell parses, the
candidates it gates exist both ways, and the snapshot_epoch skews it runs sit where the model
says they should (below the promoted production's layer head: clean; above it: a hang)."""
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


def test_the_promotion_gates_the_previous_production_both_ways():
    gates = re.findall(r"^gate (\w+) (\w+) (\w+)$", _promote_mode(), re.M)
    assert {(base, cand) for _, base, cand in gates} == {("step_b0", "production"), ("production", "step_b0")}
    for _, base, cand in gates:
        FA.candidate(base), FA.candidate(cand)  # raise on a name the catalog does not have


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
