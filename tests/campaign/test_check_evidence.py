"""`hazards check` spends its budget where evidence is thin: canaries first (each must be
detected), then the clean variant with the weakest per-launch bound, stated per variant;
then the failing points `hazards explore` left in the example database beside the store."""
from __future__ import annotations

import dataclasses

import pytest
from campaign_fakes import fake_item_for, fake_items_for, knob_family, make_family

from hazards import checkrun
from hazards.checkrun import run_check
from hazards.explore import ExploreOptions, database_entries, explore_family
from hazards.family import Variant
from hazards.hypothesis_profiles import database_dir
from hazards.engine.campaign import LeasedCampaign


@pytest.fixture(autouse=True)
def no_static(monkeypatch):
    monkeypatch.setattr(checkrun, "run_static", lambda paths, families=None, skip_tools=(), observer=None: ([], "stubbed"))


def uneven_items(family, variants):
    """The fake family's variants, the reference with 1 launch per run and the rest 50."""
    return [dataclasses.replace(i, launches=1 if i.variant == "reference" else 50)
            for i in fake_items_for(family, variants)]


def test_check_states_per_launch_bounds_and_tightens_the_weakest(fake_gpus, store, monkeypatch):
    monkeypatch.setattr(checkrun, "CLEAN_REQUEST_S", None)  # each item's own launches: the allocation alone
    res = run_check(budget_s=4, catalog=[make_family()], store=store, items_for=uneven_items, wait_s=0)
    v = {x.variant: x for x in res.verdicts}
    ref, fixed = v["reference"], v["fixed"]
    assert ref.status == fixed.status == "clean" and res.exit_code == 0
    assert "per launch <= " in ref.message and f"({ref.launches:,} launches)" in ref.message
    assert ref.launches == ref.runs and fixed.launches == 50 * fixed.runs
    assert ref.runs > 10 * fixed.runs  # runs went to the 1-launch variant: its bound was the weaker
    assert ref.launch_upper / fixed.launch_upper == pytest.approx(1.0, rel=0.25)
    assert res.to_json()["verdicts"][0]["launch_upper"] is not None


def test_check_grows_clean_requests_and_keeps_canary_requests(fake_gpus, store):
    res = run_check(budget_s=3, catalog=[make_family()], store=store, items_for=fake_items_for, wait_s=0)
    launches: dict[str, set[int]] = {}
    for sr in store.runs(res.campaign_id):
        launches.setdefault(sr.result.variant, set()).add(sr.result.metrics["launches"])
    assert launches["broken"] == {10} and max(launches["fixed"]) > 10 and max(launches["reference"]) > 10
    v = {x.variant: x for x in res.verdicts}
    assert v["fixed"].launches > 10 * v["fixed"].runs and res.exit_code == 0


def test_with_stall_detection_off_check_keeps_each_items_own_requests(fake_gpus, store):
    # A grown request's timeout grows with it (up to 50x the family's): only the stall window
    # keeps a hang in it quick to find. Without one, a hang in a grown clean request ran past
    # the budget's end and was given up unjudged, not stored: the check passed over it.
    res = run_check(budget_s=3, catalog=[make_family()], store=store, items_for=fake_items_for, wait_s=0,
                    stall="off")
    launches = {sr.result.metrics["launches"] for sr in store.runs(res.campaign_id)}
    assert launches == {10} and res.exit_code == 0


def test_check_runs_every_canary_before_any_clean_variant(fake_gpus, store):
    second = Variant("broken_too", "broken", "another seeded hazard", params={"fail_prob": 1.0},
                     detected_by=("stress",))
    res = run_check(budget_s=3, catalog=[make_family(extra=(second,))], store=store, items_for=fake_items_for,
                    wait_s=0)
    first_two = [sr.result.variant for sr in sorted(store.runs(res.campaign_id), key=lambda sr: sr.seq)[:2]]
    assert sorted(first_two) == ["broken", "broken_too"]  # two GPUs, two canaries: both first
    assert {x.variant: x.status for x in res.verdicts if x.role == "canary"} == {
        "broken": "detected", "broken_too": "detected"}


def knob_items(family, variants):
    """Check items of the knob family: its canary fails every launch, its fixed variant never."""
    return [fake_item_for(2000 if v.name == "fixed" else 0)({"variant": v.name}) for v in variants]


def test_check_replays_the_failing_points_explore_left_in_the_database(fake_gpus, store, monkeypatch):
    # most of the budget to the replay: on a loaded box its fake server must have time to start
    monkeypatch.setattr("hazards.checkrun.REPLAY_SHARE", 0.75)
    fam = knob_family(model_from=500)
    with LeasedCampaign.on_cpu(store) as frame:  # last night: a point the model calls safe failed
        found = explore_family(frame, fam, ExploreOptions(examples=100, point_runs=0),
                               database_dir=database_dir(store.path), item_for=fake_item_for(300))
    assert found.findings and database_entries(database_dir(store.path), fam)
    res = run_check(budget_s=10, catalog=[fam], store=store, items_for=knob_items, wait_s=0,
                    explore_item_for=lambda f: fake_item_for(300))
    replay = [x for x in res.verdicts if x.role == "explore"]
    assert [(x.family, x.variant, x.status) for x in replay] == [("knobfam", "explore points", "failed")]
    assert "MODEL MISSED A HAZARD" in replay[0].message and "hazards repro --family knobfam" in replay[0].message
    assert res.exit_code == 1 and store.campaign(res.campaign_id).spec["replay"] == ["knobfam"]
    # fixed: the replayed points pass, the check passes, and the database forgets them
    res = run_check(budget_s=10, catalog=[fam], store=store, items_for=knob_items, wait_s=0,
                    explore_item_for=lambda f: fake_item_for(2000))
    assert [x.status for x in res.verdicts if x.role == "explore"] == ["clean"] and res.exit_code == 0
    assert database_entries(database_dir(store.path), fam) == 0
    res = run_check(budget_s=2, catalog=[fam], store=store, items_for=knob_items, wait_s=0)
    assert not [x for x in res.verdicts if x.role == "explore"]  # nothing known: no replay at all


def test_a_grown_clean_request_keeps_the_stall_floor_its_margin_under_contention():
    """A family that does not wait for each launch shows no heartbeat until a request's queued
    launches have run: a grown request's GPU time is a gap between progress events. The stall
    floor is 5x the largest gap measured under GPU contention, where a request ran up to 3x
    slower (barrier_layout: 0.06 s uncontended, 0.18 s under the hammer; docs/results/
    hangs-h200.md); a grown request must keep that 5x (0.25-s requests gave 0.25-s gaps)."""
    from hazards.engine.stall import CALIBRATION_FACTOR, STALL_FLOOR_S

    slowdown = 3.0
    assert checkrun.CLEAN_REQUEST_S * slowdown * CALIBRATION_FACTOR <= STALL_FLOOR_S
