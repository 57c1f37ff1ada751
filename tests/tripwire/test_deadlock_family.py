"""Family `deadlock`: the static model against an independent simulation of the protocols.

The simulation executes each scenario's arrive/wait protocol step by step under a chosen
schedule (which worker moves next). "Deadlocks" = some schedule reaches a state where
workers remain and none can move. Fixed variants must survive every schedule tried,
including the adversarial one that delays a worker exactly where the bug needs it.
"""
from __future__ import annotations

import random

import hypothesis.strategies as st
from hypothesis import given, settings

from hazards.families import get_family
from hazards.families.deadlock import epoch_hang_probability, static_model

FAM = get_family("deadlock")


# ----------------------------------------------------------------- protocol simulation --
def simulate_epoch(W: int, P: int, L: int, fix: str, order) -> bool:
    """True when the schedule deadlocks. `order(enabled, state)` picks the next worker."""
    parts = W if fix == "widen" else P
    shared = {"qkv": 0, "release": 0, "moe": 0}
    st_ = [{"l": 0, "pc": 0, "want": 0} for _ in range(W)]

    def enabled(r: int) -> bool:
        s = st_[r]
        if s["l"] >= L:
            return False
        if s["pc"] == 2:
            return shared["moe"] >= W * s["l"]
        if s["pc"] == 3:
            return shared["release"] >= s["want"]
        return True

    while True:
        ready = [r for r in range(W) if enabled(r)]
        if not ready:
            return any(s["l"] < L for s in st_)
        r = order(ready, st_)
        s = st_[r]
        if s["pc"] == 0:  # layer entry: the snapshot
            s["want"] = s["l"] + 1 if fix == "derive" else shared["release"] + 1
            s["pc"] = 1
        elif s["pc"] == 1:  # first barrier (participants only)
            if r < parts:
                old = shared["qkv"]
                shared["qkv"] += 1
                s["pc"] = 2 if old == parts * (s["l"] + 1) - 1 else 3
            else:
                s["pc"] = 3
        elif s["pc"] == 2:  # the merger: all MoE tiles of the previous layer, then bump
            shared["release"] = s["l"] + 1
            s["pc"] = 3
        elif s["pc"] == 3:  # waited for the release
            s["pc"] = 4
        else:  # MoE arrival, next layer
            shared["moe"] += 1
            s["l"] += 1
            s["pc"] = 0


def lag_last_worker(W: int):
    """Adversarial: worker W-1 (a non-participant when P < W) never moves from a layer
    entry after layer 0 while anyone else can; otherwise the lowest ready worker moves."""
    def order(ready, state):
        others = [r for r in ready if r != W - 1]
        lagging = state[W - 1]["pc"] == 0 and state[W - 1]["l"] >= 1
        return others[0] if (lagging and others) else ready[0]
    return order


def start_last_worker_late(W: int):
    """Adversarial: worker W-1 takes its first step only when nobody else can move (a
    block dispatched after the first merger bumped)."""
    def order(ready, state):
        others = [r for r in ready if r != W - 1]
        fresh = state[W - 1]["pc"] == 0 and state[W - 1]["l"] == 0
        return others[0] if (fresh and others) else ready[0]
    return order


def random_order(seed: int):
    rng = random.Random(seed)
    return lambda ready, state: rng.choice(ready)


def test_epoch_snapshot_deadlocks_under_the_lagging_schedule() -> None:
    assert simulate_epoch(W=8, P=3, L=4, fix="none", order=lag_last_worker(8))


def test_epoch_snapshot_deadlocks_in_one_layer_when_a_block_starts_late() -> None:
    assert simulate_epoch(W=2, P=1, L=1, fix="none", order=start_last_worker_late(2))


def test_epoch_fixes_survive_the_adversarial_schedules() -> None:
    for fix in ("derive", "widen"):
        for order in (lag_last_worker(8), start_last_worker_late(8)):
            assert not simulate_epoch(W=8, P=3, L=4, fix=fix, order=order)


@settings(max_examples=60, deadline=None)
@given(W=st.integers(2, 10), P=st.integers(1, 10), L=st.integers(1, 5), seed=st.integers(0, 2**32))
def test_static_model_matches_the_simulation_for_snapshot_epoch(W: int, P: int, L: int, seed: int) -> None:
    P = min(P, W)
    for fix, variant in (("none", "broken_epoch"), ("derive", "fixed_epoch"), ("widen", "fixed_epoch_widen")):
        v = static_model({"variant": variant, "workers": W, "participants": P, "layers": L, "skew_ppm": 1000})
        hangs = simulate_epoch(W, P, L, fix, lag_last_worker(W)) or simulate_epoch(W, P, L, fix, random_order(seed))
        if not v.hazardous:
            assert not hangs, (fix, W, P, L)
        else:  # hazardous: a schedule that starts the last worker late, or lags it a layer, hangs
            late = simulate_epoch(W, P, L, fix, start_last_worker_late(W))
            assert late or simulate_epoch(W, P, L, fix, lag_last_worker(W)), (fix, W, P, L)


def simulate_chunk(W: int, Q: int, C: int, nested: bool) -> bool:
    arrivals = sum(1 for r in range(W) if r < C and (r < Q or not nested))
    return arrivals < C  # the merge (and so the release every worker waits for) needs C


@settings(max_examples=100, deadline=None)
@given(W=st.integers(1, 64), Q=st.integers(0, 64), C=st.integers(1, 64), nested=st.booleans())
def test_static_model_matches_the_simulation_for_chunk_count(W: int, Q: int, C: int, nested: bool) -> None:
    C = min(C, W)
    v = static_model({"scenario": "chunk_count", "workers": W, "qkv_tiles": Q, "chunks": C, "nested": nested})
    assert v.hazardous == simulate_chunk(W, Q, C, nested)


def test_the_mi355_point_of_chunk_count_is_ten_of_sixteen() -> None:
    v = static_model({"variant": "broken_chunk"})
    assert v.hazardous and "only 10 of 16" in v.reason
    assert not static_model({"variant": "fixed_chunk"}).hazardous


def test_grid_barrier_hazard_is_exactly_grid_over_the_limit() -> None:
    assert static_model({"variant": "broken_grid"}).hazardous
    assert not static_model({"variant": "fixed_grid"}).hazardous
    assert not static_model({"scenario": "grid_barrier", "grid_extra": -5}).hazardous


def test_epoch_hang_probability_counts_non_participant_layer_boundaries() -> None:
    p = FAM.resolve({"variant": "broken_epoch"})
    assert epoch_hang_probability(p) == 1 - (1 - 1e-3) ** ((64 - 16) * 7)
    assert epoch_hang_probability(FAM.resolve({"variant": "fixed_epoch"})) == 0.0
    assert epoch_hang_probability({**p, "participants": 64}) == 0.0


def test_every_broken_variant_is_hazardous_and_every_fixed_one_is_not() -> None:
    for v in FAM.variants:
        assert static_model({"variant": v.name}).hazardous == (v.role == "broken"), v.name


@settings(max_examples=50, deadline=None)
@given(FAM.strategy())
def test_strategy_points_are_valid_for_the_binary(point: dict) -> None:
    p = FAM.resolve(point)
    assert point["variant"] in {v.name for v in FAM.variants}
    if p["scenario"] == "chunk_count":
        assert p["chunks"] <= p["workers"]  # the binary rejects more
    if p["scenario"] == "snapshot_epoch":
        assert p["participants"] <= p["workers"]
    assert isinstance(static_model(point).hazardous, bool)
