"""`hazards explore`: the static model as a two-way oracle over a fake family served by the fake
server, shrinking to the edge of the disagreement, re-measurement, and the example database
beside the store replayed across runs."""
from __future__ import annotations

import dataclasses
import json

import pytest
from campaign_fakes import LAUNCHES, fake_item_for, knob_family

from hazards.cli import main
from hazards.explore import Agreement, ExploreOptions, database_entries, explore_family, launch_budget
from hazards.replay import repro_command
from hazards.engine.campaign import LeasedCampaign


def explore(store, tmp_path, fam, fails_from, **opts):
    kw = {"examples": 60, "seed": 1, "point_runs": 5, **opts}
    with LeasedCampaign.on_cpu(store) as frame:
        return explore_family(frame, fam, ExploreOptions(**kw), database_dir=tmp_path / "hypothesis",
                              item_for=fake_item_for(fails_from))


def test_a_point_the_model_calls_safe_that_fails_is_a_missed_hazard_shrunk_to_its_edge(store, tmp_path):
    res = explore(store, tmp_path, knob_family(model_from=500), fails_from=300)
    assert [f.kind for f in res.findings] == [Agreement.MISSED]
    f = res.findings[0]
    assert f.point == {"variant": "fixed", "knob": 300}  # the smallest failing point the model calls safe
    assert f.confirmed and f.remeasured.failures == 5 and f.remeasured.judged == 5
    assert f.remeasured.failed_launches == f.remeasured.launches == 5 * LAUNCHES
    assert f.repro == repro_command("knobfam", {"variant": "fixed", "knob": 300})
    text = "\n".join(res.lines())
    assert "MODEL MISSED A HAZARD" in text and "5/5 runs failed" in text and f"replay: {f.repro}" in text
    assert res.exit_code == 1
    # every run is in the store, in one explore campaign
    camp = store.campaign(res.campaign_id)
    assert camp.kind == "explore" and store.run_count(res.campaign_id) >= res.totals()["runs"]


def test_a_point_the_model_calls_hazardous_that_stays_clean_is_a_gap_or_a_blind_harness(store, tmp_path):
    res = explore(store, tmp_path, knob_family(model_from=300, rate=0.5), fails_from=500)
    assert [f.kind for f in res.findings] == [Agreement.GAP]
    f = res.findings[0]
    assert f.point == {"variant": "fixed", "knob": 300}
    # rate 0.5 per launch: the point had ln(1e-3)/ln(0.5) -> 10 launches to fail, ran 3 runs of 4
    assert f.observation.budget == launch_budget(0.5) == 10 and f.observation.evidence.launches == 12
    assert f.confirmed and f.remeasured.failures == 0  # re-measured: <= 0.5 shown, so it stands
    assert "MODEL GAP OR BLIND HARNESS" in "\n".join(res.lines()) and res.exit_code == 1


def test_a_gap_whose_remeasured_rate_is_consistent_with_the_model_is_not_confirmed(store, tmp_path):
    # 5 runs of 4 launches cannot show a point's rate below 5% per launch (bound 14%)
    res = explore(store, tmp_path, knob_family(model_from=300, rate=0.05), fails_from=2000, examples=20)
    gap = [f for f in res.findings if f.kind is Agreement.GAP]
    assert gap and not gap[0].confirmed and res.exit_code == 0
    assert "NOT CONFIRMED" in "\n".join(res.lines())


def test_a_point_that_fails_far_more_often_than_predicted_is_a_confirmed_rate_disagreement(store, tmp_path):
    # the model has the outcome right (hazardous from 300) and the rate wrong: 1% per launch
    # predicted, every launch fails (the stale_release case of megakernel_layers, the other way)
    res = explore(store, tmp_path, knob_family(model_from=300, rate=0.01), fails_from=300)
    assert [f.kind for f in res.findings] == [Agreement.RATE]
    f = res.findings[0]
    assert f.point == {"variant": "fixed", "knob": 300}
    assert f.confirmed and f.remeasured.failed_launches == f.remeasured.launches == 5 * LAUNCHES
    text = "\n".join(res.lines())
    assert "MODEL RATE DISAGREES" in text and "0.01 per launch" in text and res.exit_code == 1


def test_points_where_model_and_runs_agree_pass_with_an_agreement_table(store, tmp_path):
    res = explore(store, tmp_path, knob_family(model_from=400), fails_from=400)
    assert res.findings == [] and res.exit_code == 0
    table = res.table()
    assert set(table["safe"]) <= {"clean"} and set(table["hazardous, rate > 0"]) <= {"failed"}
    assert sum(table["safe"].values()) + sum(table["hazardous, rate > 0"].values()) == len(res.observations)
    assert res.first_failure_example == next(o.index for o in res.observations if o.point["knob"] >= 400)
    assert "agrees with the model" in res.lines()[-1]


def test_unrated_and_elsewhere_only_hazards_are_held_to_nothing_they_did_not_predict(store, tmp_path):
    # knob >= 300 hazardous but not rated; >= 700 hazardous only elsewhere (rate 0 here): the
    # fake fails from 800, so 700..799 agree (clean) and 800+ are a hazard the model missed
    res = explore(store, tmp_path, knob_family(model_from=300, rate=None, zero_from=700), fails_from=800)
    kinds = {o.agreement for o in res.observations}
    assert Agreement.GAP not in kinds and kinds <= {Agreement.CLEAN, Agreement.UNCONFIRMED, Agreement.OBSERVED,
                                                    Agreement.MISSED}
    missed = [f for f in res.findings if f.kind is Agreement.MISSED]
    assert missed and missed[0].point["knob"] == 800
    assert res.table()["hazardous, rate 0 here"].get("missed")


def test_runs_the_binary_refuses_are_not_findings(store, tmp_path):
    with LeasedCampaign.on_cpu(store) as frame:
        res = explore_family(frame, knob_family(model_from=400), ExploreOptions(examples=10, seed=2),
                             database_dir=tmp_path / "hypothesis",
                             item_for=lambda p: fake_item_for(400, action="bad_request")(p))
    assert res.findings == [] and {o.agreement for o in res.observations} == {Agreement.REFUSED}
    assert res.exit_code == 3  # nothing could be judged


def test_known_failing_points_are_replayed_from_the_database_beside_the_store(store, tmp_path):
    fam = knob_family(model_from=500)
    first = explore(store, tmp_path, fam, fails_from=300, seed=None, examples=100)  # a seed turns the database off
    assert first.findings and database_entries(tmp_path / "hypothesis", fam) >= 1
    # next run, replay only: just the stored points, the minimal one among them, no generation
    again = explore(store, tmp_path, fam, fails_from=300, replay=True, seed=None)
    # (hypothesis runs a failing example once more to report it)
    assert again.replayed >= 1 and 1 <= len({json.dumps(o.point) for o in again.observations}) <= again.replayed
    assert {"variant": "fixed", "knob": 300} in [o.point for o in again.observations]
    assert [f.kind for f in again.findings] == [Agreement.MISSED] and again.exit_code == 1
    # the kernel is fixed: the replayed points pass, and the database forgets them
    fixed = explore(store, tmp_path, fam, fails_from=2000, replay=True, seed=None)
    assert fixed.findings == [] and fixed.exit_code == 0 and fixed.observations
    assert database_entries(tmp_path / "hypothesis", fam) == 0
    empty = explore(store, tmp_path, fam, fails_from=2000, replay=True, seed=None)
    assert empty.observations == [] and "nothing to replay" in empty.stop_reason


def test_a_time_budget_ends_the_search_and_nothing_is_left_running(store, tmp_path):
    fam = knob_family(model_from=2000)
    with LeasedCampaign.on_cpu(store) as frame:
        res = explore_family(frame, fam, ExploreOptions(budget_s=8, seed=3), database_dir=tmp_path / "hypothesis",
                             item_for=fake_item_for(2000, sleep_s=0.05))
    # 8 s: on a loaded 2-core CI box the first point alone can take seconds to start
    assert res.observations and res.stop_reason == "the budget ended" and res.exit_code == 0
    assert res.elapsed_s < 40
    # the point in hand when the budget ended is not an error: dropped if it never ran
    assert "error" not in res.counts() and all(o.evidence.n for o in res.observations)


def test_launch_budget_follows_the_predicted_rate():
    assert launch_budget(1.0) == 1
    assert launch_budget(0.5) == 10          # 0.5**10 < 1e-3 <= 0.5**9
    assert launch_budget(0.01) == 688
    with pytest.raises(ValueError):
        launch_budget(0.0)


def test_explore_refuses_bad_input_with_one_line(capsys):
    assert main(["explore", "no_such_family"]) == 2
    assert main(["explore", "earlyclobber"]) == 2
    err = capsys.readouterr().err
    assert "nothing to explore called 'no_such_family'" in err and "ragged_decode" in err
    assert "'earlyclobber' (a static family: no runtime binary)" in err


def test_a_target_that_cannot_run_stops_the_search_with_its_reason(store, tmp_path):
    with LeasedCampaign.on_cpu(store) as frame:
        res = explore_family(frame, knob_family(model_from=400), ExploreOptions(examples=50, seed=4, point_runs=0),
                             database_dir=tmp_path / "hypothesis",
                             item_for=lambda p: dataclasses.replace(fake_item_for(400)(p), argv=("/no/such/server",)))
    assert len(res.observations) == 3 and res.stop_reason == "the target could not run"
    assert "errors in a row" in res.error and res.exit_code == 3


def test_the_targeting_measurement_stops_at_the_first_point_failing_at_its_rate(store, tmp_path):
    res = explore(store, tmp_path, knob_family(model_from=0, rate=None), fails_from=600, stop_at_rate=0.5,
                  target=False, examples=200)
    assert res.observations[-1].point["knob"] >= 600 and res.first_failure_example == len(res.observations)
    assert res.stop_reason.startswith(f"example {len(res.observations)} failed at rate 1")
