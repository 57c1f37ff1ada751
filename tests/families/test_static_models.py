"""The static models of `pipeline` and `ordering`, and their hypothesis strategies."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hazards.families import get_family
from hazards.families import ordering, pipeline


# --------------------------------------------------------------------------- pipeline --
@pytest.mark.parametrize("variant, hazardous", [
    ("reference", False), ("fixed", False), ("fixed_pingpong", False),
    ("broken_war", True), ("broken_wait", True), ("broken_tail", True),
])
def test_pipeline_named_variants_have_the_expected_verdict(variant, hazardous):
    assert pipeline.static_model({"variant": variant}).hazardous is hazardous


def test_pipeline_single_tail_is_wrong_at_one_parity_only():
    for t in range(1, 40):
        v = pipeline.static_model({"variant": "fixed_pingpong", "tail": "single", "ktiles": t})
        assert v.hazardous is (t % 2 == 0), t  # 2 stages: last tile in slot (T-1)%2


def test_pipeline_wait_depth_hazard_is_one_too_shallow_or_more():
    for stages in (1, 2, 3, 4):
        for war in (True, False):
            right = pipeline.correct_wait_depth(stages, war)
            base = {"stages": stages, "copy": "cp_async", "war_barrier": war, "ktiles": 1}
            assert not pipeline.static_model({**base, "wait_depth": right}).hazardous
            assert not pipeline.static_model({**base, "wait_depth": -1}).hazardous
            assert pipeline.static_model({**base, "wait_depth": right + 1}).hazardous
            if right > 0:  # waiting deeper than needed is slow, not wrong
                assert not pipeline.static_model({**base, "wait_depth": right - 1}).hazardous


def test_pipeline_wait_depth_is_irrelevant_for_plain_copies():
    assert not pipeline.static_model({"stages": 3, "copy": "plain", "wait_depth": 4}).hazardous


def test_pipeline_missing_war_barrier_needs_a_refill_of_a_read_slot():
    # the first refill of a slot read before happens at trip 1 with tile S: needs T >= S+1
    for stages in (1, 2, 3, 4):
        for t in (1, stages, stages + 1, 40):
            v = pipeline.static_model({"stages": stages, "war_barrier": False, "ktiles": t})
            assert v.hazardous is (t >= stages + 1), (stages, t)


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_pipeline_strategy_points_resolve_inside_the_declared_domain(data):
    point = data.draw(get_family("pipeline").strategy())
    assert point["variant"] in {v.name for v in pipeline.FAMILY.variants}
    p = pipeline.FAMILY.resolve(point)
    assert set(p) == set(pipeline.FAMILY.defaults)
    assert 1 <= p["stages"] <= 4 and 1 <= p["ktiles"] <= 256 and -1 <= p["wait_depth"] <= 7
    assert p["copy"] in ("plain", "cp_async") and p["tail"] in ("parity", "single")
    verdict = pipeline.static_model(point)
    assert verdict.hazardous is bool(pipeline.hazards(point)) and verdict.reason


# --------------------------------------------------------------------------- ordering --
@pytest.mark.parametrize("variant, hazardous", [
    ("mp_fenced", False), ("mp_relacq", False), ("mp_plain", True), ("sb_fenced", False),
    ("sb_plain", True), ("lb_fenced", False), ("lb_plain", True), ("corr", False),
    ("pc_fixed", False), ("pc_fence", False), ("pc_no_acquire", True),
])
def test_ordering_named_variants_have_the_expected_verdict(variant, hazardous):
    assert ordering.static_model({"variant": variant}).hazardous is hazardous


@pytest.mark.parametrize("test", ["mp", "lb", "pc"])
def test_message_passing_needs_release_on_the_writer_and_acquire_on_the_reader(test):
    for w in ("none", "fence", "release"):
        for r in ("none", "fence", "acquire"):
            v = ordering.static_model({"test": test, "writer_sync": w, "reader_sync": r})
            assert v.hazardous is not (w != "none" and r != "none"), (w, r)


def test_store_buffering_needs_full_fences_on_both_sides():
    for w in ("none", "fence", "release"):
        for r in ("none", "fence", "acquire"):
            v = ordering.static_model({"test": "sb", "writer_sync": w, "reader_sync": r})
            assert v.hazardous is not (w == "fence" and r == "fence"), (w, r)


def test_coherence_needs_no_fence():
    assert not ordering.static_model({"test": "corr", "writer_sync": "none", "reader_sync": "none"}).hazardous


def test_instances_per_launch_follow_the_shape():
    assert ordering.instances_per_launch({"variant": "mp_plain"}, sm_count=132) == 132 * 256
    assert ordering.instances_per_launch({"variant": "pc_fixed", "test_blocks": 8, "iters": 10}) == 80


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_ordering_strategy_points_resolve_inside_the_declared_domain(data):
    point = data.draw(get_family("ordering").strategy())
    p = ordering.FAMILY.resolve(point)
    assert set(p) == set(ordering.FAMILY.defaults)
    assert p["threads"] & (p["threads"] - 1) == 0
    assert p["test"] in ("mp", "sb", "lb", "corr", "pc")
    blocks = (p["test_blocks"] or 132) * (2 if p["test"] == "pc" else 1) + (
        0 if p["test"] == "pc" else p["stress_blocks"])
    # always co-resident on an H200 (the litmus kernel fits 6 blocks of 256 threads per SM,
    # 792 in all): no point of the strategy is a bad request or a deadlock
    assert blocks <= 792
    assert ordering.static_model(point).reason
