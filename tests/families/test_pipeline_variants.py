"""pipeline's single_jitter is broken_war with its WAR barrier back: the same timing (jitter)
and schedule otherwise, correct by the static model, so it is the fixed variant that shows a
single buffer whose barrier was lost (hazards mutate's remove-barrier there), which the
jitter-free reference may not."""
from __future__ import annotations

from hazards.families import get_family


def test_single_jitter_is_broken_war_with_the_war_barrier_back():
    from variant_pairs import differing_params

    fam = get_family("pipeline")
    assert differing_params("pipeline", "single_jitter", "broken_war") == {"war_barrier": (True, False)}
    assert fam.resolve({"variant": "single_jitter"})["jitter"] > 0
    assert fam.variant("single_jitter").role == "fixed"
    assert fam.static_model({"variant": "single_jitter"}).hazardous is False
