"""The rate per launch each runtime family's static model predicts on the H200, the number
`hazards explore` holds the model to: consistent with the catalog's roles and with every
strategy point."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hazards.families import all_families
from hazards.family import StaticVerdict, combined_rate

RUNTIME = [f for f in all_families() if f.binary]


@pytest.mark.parametrize("family", RUNTIME, ids=lambda f: f.name)
def test_the_predicted_rate_agrees_with_what_each_variant_is_for(family):
    for v in family.variants:
        verdict = family.static_model({"variant": v.name})
        if not v.is_canary:
            assert verdict.expected_rate == 0.0, (v.name, verdict)
        elif "stress" in v.detected_by:  # stress must see it here: the model predicts it fails here
            assert verdict.expected_rate is None or verdict.expected_rate > 0, (v.name, verdict)
        else:  # seen only by the static checks (an AMD mechanism, a compiler-repaired race, or a
            # race not measured on the GPU yet: not predicted, never a made-up rate)
            assert verdict.expected_rate in (0.0, None), (v.name, verdict)


@pytest.mark.parametrize("family", RUNTIME, ids=lambda f: f.name)
def test_every_strategy_point_gets_a_rate_that_is_a_probability_or_none(family):
    @given(st.data())
    @settings(max_examples=40, deadline=None, database=None)
    def check(data):
        verdict = family.static_model(data.draw(family.strategy()))
        rate = verdict.expected_rate
        assert rate is None or 0.0 <= rate <= 1.0
        if not verdict.hazardous:
            assert rate == 0.0
    check()


def test_rates_of_independent_hazards_combine():
    assert combined_rate([1.0]) == 1.0 and combined_rate([0.0]) == 0.0
    assert combined_rate([0.5, 0.5]) == pytest.approx(0.75)
    assert combined_rate([0.1, None]) == pytest.approx(0.1)  # a lower bound: the unrated one only adds
    assert combined_rate([None]) is None and combined_rate([0.0, None]) is None


def test_a_rate_must_be_a_probability():
    with pytest.raises(ValueError):
        StaticVerdict(True, "x", 1.5)
