"""pipeline's single_jitter is broken_war with its WAR barrier back: the same timing (jitter)
and schedule otherwise, correct by the static model, so it is the fixed variant that shows a
single buffer whose barrier was lost (hazards mutate's remove-barrier there), which the
jitter-free reference may not."""
from __future__ import annotations

from hazards.families import get_family


def test_single_jitter_is_broken_war_with_the_war_barrier_back():
    fam = get_family("pipeline")
    fixed, broken = fam.resolve({"variant": "single_jitter"}), fam.resolve({"variant": "broken_war"})
    assert fixed["war_barrier"] is True and broken["war_barrier"] is False
    assert fixed["jitter"] == broken["jitter"] > 0
    assert {k: v for k, v in fixed.items() if k not in ("variant", "war_barrier")} == \
        {k: v for k, v in broken.items() if k not in ("variant", "war_barrier")}
    assert fam.variant("single_jitter").role == "fixed"
    assert fam.static_model({"variant": "single_jitter"}).hazardous is False
