"""Family `mma_pingpong`: its static model over (banks, wait depth, trip count and parity, exit
tail, accumulator read) and its hypothesis strategy. CPU only; the compiled kernels are
checked in tests/static/test_wgmma_checks.py and run in docs/results/mma-pingpong-h200.md."""
from __future__ import annotations

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from hazards.families import get_family, mma_pingpong as mp


@pytest.mark.parametrize("variant, hazardous", [
    ("reference", False), ("fixed", False), ("fixed_threads", False), ("fixed_threads_skewed", False), ("broken_war", True),
    ("broken_war_threads", True), ("broken_tail", True), ("broken_acc_read", True),
])
def test_named_variants_have_the_verdict_their_role_says(variant, hazardous):
    assert mp.static_model({"variant": variant}).hazardous is hazardous
    assert get_family("mma_pingpong").variant(variant).is_canary is hazardous


def test_the_single_exit_tail_is_wrong_exactly_when_the_last_tile_is_not_in_bank_0():
    for stages in (1, 2, 3, 4):
        for t in range(1, 40):
            v = mp.static_model({"variant": "fixed", "stages": stages, "wait_depth": 0,
                                 "tail": "single", "ktiles": t})
            assert v.hazardous is ((t - 1) % stages != 0), (stages, t)


def test_the_ping_pong_single_tail_is_wrong_at_even_trip_counts_only():
    verdicts = {t: mp.static_model({"variant": "broken_tail", "ktiles": t}).hazardous for t in range(1, 24)}
    assert all(verdicts[t] is (t % 2 == 0) for t in verdicts)


@pytest.mark.parametrize("refill", ["bulk", "threads"])
def test_a_refill_races_iff_the_wait_leaves_its_banks_last_reader_in_flight(refill):
    for stages in (1, 2, 3, 4):
        for wait in range(0, mp.MAX_WAIT + 1):
            for t in (1, stages, stages + 1, 40):
                v = mp.static_model({"variant": "fixed", "stages": stages, "wait_depth": wait, "ktiles": t,
                                     "refill": refill})
                assert v.hazardous is (wait >= stages and t >= stages + 1), (stages, wait, t)
                assert not v.hazardous or ("st.shared" in v.reason) is (refill == "threads")


def test_the_default_wait_depth_is_the_deepest_safe_overlap():
    for stages in (1, 2, 3, 4):
        p = {"variant": "fixed", "stages": stages, "wait_depth": -1, "ktiles": 40}
        assert mp.effective_wait_depth(mp.FAMILY.resolve(p)) == min(stages - 1, mp.MAX_WAIT)
        assert not mp.static_model(p).hazardous


def test_reading_accumulators_before_the_final_wait_is_a_source_hazard_at_every_point():
    for stages, t in ((1, 1), (2, 16), (4, 3)):
        v = mp.static_model({"variant": "fixed", "stages": stages, "ktiles": t, "acc_read": "before_wait"})
        assert v.hazardous and "serializes" in v.reason


def test_predicted_checks_follow_the_code_not_the_trip_count():
    assert mp.predicted_checks({"variant": "broken_war", "ktiles": 1}) == {"wgmma-refill-in-flight"}
    assert mp.predicted_checks({"variant": "broken_tail"}) == set()
    assert mp.predicted_checks({"variant": "broken_war", "acc_read": "before_wait"}) == {"wgmma-early-access"}
    assert mp.predicted_checks({"variant": "broken_war_threads", "ktiles": 1}) == {"wgmma-refill-in-flight"}
    assert mp.predicted_checks({"variant": "fixed_threads"}) == set()


def test_kernel_symbol_names_the_template_instantiation():
    assert mp.kernel_symbol({"variant": "fixed"}) == "mma_pingpong_kernelILi128ELi64ELi1ELb0ELb0EE"
    assert mp.kernel_symbol({"variant": "broken_acc_read", "shape": "64x16"}) == \
        "mma_pingpong_kernelILi64ELi16ELi1ELb1ELb0EE"
    assert mp.kernel_symbol({"variant": "broken_war_threads"}) == "mma_pingpong_kernelILi128ELi64ELi1ELb0ELb1EE"


@given(st.data())
@settings(max_examples=80, deadline=None)
def test_strategy_points_resolve_inside_the_binarys_domain(data):
    point = data.draw(mp.strategy())
    p = mp.FAMILY.resolve(point)
    assert set(p) == set(mp.FAMILY.defaults) and point["variant"] in {v.name for v in mp.FAMILY.variants}
    assert p["shape"] in mp.SHAPES and 1 <= p["stages"] <= 4 and -1 <= p["wait_depth"] <= mp.MAX_WAIT
    assert 1 <= p["ktiles"] <= 128 and 0 <= p["jitter"] <= 64 and p["inputs"] == "uniform"
    assert mp.static_model(point).reason
    assert not (p["refill"] == "threads" and p["acc_read"] == "before_wait")  # not compiled: refused


@pytest.mark.parametrize("want", [
    lambda p: p["ktiles"] % 2 == 0 and mp.static_model(p).hazardous and p["tail"] == "single",
    lambda p: p["ktiles"] % 2 == 1 and not mp.static_model(p).hazardous,
    lambda p: mp.effective_wait_depth(mp.FAMILY.resolve(p)) == int(mp.FAMILY.resolve(p)["stages"]),  # one too shallow
    lambda p: int(mp.FAMILY.resolve(p)["jitter"]) > 0 and mp.FAMILY.resolve(p)["shape"] == "64x16",
    lambda p: mp.FAMILY.resolve(p)["refill"] == "threads" and mp.static_model(p).hazardous,
    lambda p: mp.FAMILY.resolve(p)["refill"] == "bulk" and int(mp.FAMILY.resolve(p)["stages"]) == 1
    and mp.effective_wait_depth(mp.FAMILY.resolve(p)) == 1,
])
def test_the_strategy_reaches_both_parities_shallow_waits_jitter_every_shape_and_refill(want):
    find(mp.strategy(), lambda point: want(mp.FAMILY.resolve(point)), settings=settings(max_examples=2000, database=None))


def test_the_skewed_fixed_variant_is_fixed_threads_schedule_with_only_a_warp_skew_added():
    # warp_skew is timing only: the skewed variant must be the very schedule fixed_threads is
    # (same kernel, same SASS checks), with warp 3 lagging, so a mismatch in it can only come
    # from a missing barrier between the warps (hazards mutate's barrier mutants)
    from variant_pairs import differing_params

    fam = get_family("mma_pingpong")
    assert differing_params("mma_pingpong", "fixed_threads_skewed", "fixed_threads") == {"warp_skew": (16, 0)}
    assert mp.kernel_symbol({"variant": "fixed_threads_skewed"}) == mp.kernel_symbol({"variant": "fixed_threads"})
    assert mp.predicted_checks({"variant": "fixed_threads_skewed"}) == mp.predicted_checks({"variant": "fixed_threads"})
    assert fam.variant("fixed_threads_skewed").role == "fixed"
