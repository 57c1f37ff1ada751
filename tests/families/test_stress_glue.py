"""hazards/stress_family.py and `hazards stress` against a fake family server (CPU)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hazards.families import get_family
from hazards.engine.verdict import Proof, Verdict
from hazards.stress_family import stress_variant
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.targets import ServerTarget

HARNESS = [sys.executable, str(Path(__file__).resolve().parent.parent / "fakes" / "fake_server.py"), "--harness"]


@pytest.fixture
def fake_target():
    t = ServerTarget(HARNESS, name="fake")
    yield t
    t.close()


def test_a_detected_canary_reports_its_per_launch_rate(frame, fake_target):
    r = stress_variant(get_family("pipeline"), "broken_war", frame=frame, launches=50, requests=4,
                       target=fake_target)
    assert r.verdict is Verdict.DETECTED and r.expected == "detect" and r.static_hazardous
    assert (r.evidence.launches, r.evidence.failed_launches) == (200, 200)
    d = r.to_json()
    assert d["launch_rate"] == 1.0 and d["launch_rate_ci95"][0] > 0.98
    assert d["campaign"]["counts"]["mismatch"] == 4


def test_a_clean_fixed_variant_is_clean_with_a_zero_rate(frame, fake_target):
    r = stress_variant(get_family("pipeline"), "fixed", frame=frame, launches=100, requests=3,
                       target=fake_target)
    assert r.verdict is Verdict.CLEAN and (r.evidence.launches, r.evidence.failed_launches) == (300, 0)
    assert r.to_json()["launch_rate_ci95"][1] < 0.02


def test_weak_outcomes_are_counted_per_instance(frame, fake_target):
    r = stress_variant(get_family("ordering"), "mp_plain", frame=frame, launches=10, requests=2,
                       target=fake_target)
    d = r.to_json()
    assert d["instances"] == 20000 and d["weak"] == 60 and d["weak_per_instance"] == pytest.approx(0.003)


def test_every_batch_is_stored_with_its_campaign(frame, fake_target):
    r = stress_variant(get_family("ordering"), "pc_fixed", frame=frame, launches=5, requests=3,
                       target=fake_target)
    runs = frame.store.runs(r.summary.campaign_id)
    assert len(runs) == 3 and all(x.result.params["variant"] == "pc_fixed" for x in runs)
    assert frame.store.campaign(r.summary.campaign_id).kind == "stress"


def test_a_canary_failing_only_by_spin_timeouts_is_missed_not_detected(frame):
    with ServerTarget([*HARNESS, "--spin-timeouts"], name="fake") as target:
        r = stress_variant(get_family("ordering"), "pc_no_acquire", frame=frame, launches=5, requests=2,
                           target=target)
    assert r.summary.failures == 2  # the runs did fail...
    assert (r.evidence.proved, r.evidence.unproved) == (0, 2)
    assert r.verdict is Verdict.WENT_BLIND  # ...but not because of the seeded hazard
    assert "no failure its oracle proved in 2 runs (2 failed for another reason" in r.judgement.message


def test_a_canary_failing_with_weak_outcomes_is_attributed(frame, fake_target):
    r = stress_variant(get_family("ordering"), "pc_no_acquire", frame=frame, launches=5, requests=2,
                       target=fake_target)
    assert (r.evidence.proved, r.evidence.unproved) == (2, 0) and r.verdict is Verdict.DETECTED


@pytest.mark.parametrize("outcome, error_kind, proved", [
    (Outcome.FAULT, "sanitizer_race", True),
    (Outcome.MISMATCH, None, False),  # the kernel's own comparison, not racecheck
    (Outcome.HANG, None, False),      # the 40x-slowed kernel ran past its timeout
    (Outcome.FAULT, "sanitizer_memcheck", False),  # another tool's finding
    (Outcome.CLEAN, None, False),
])
def test_only_a_sanitizer_error_counts_as_a_sanitizer_detection(outcome, error_kind, proved):
    r = RunResult(outcome=outcome, reason="x", error_kind=error_kind)
    assert Proof(sanitizer="racecheck").proves(r) is proved


def test_a_stress_failure_with_a_harness_anomaly_is_not_attributed():
    stress = Proof(anomalies=tuple(get_family("ordering").harness_anomalies))
    assert stress.proves(RunResult(Outcome.MISMATCH, "x", metrics={"weak": 4}))
    assert not stress.proves(RunResult(Outcome.MISMATCH, "x", metrics={"weak": 0, "invalid": 3}))
    assert stress.proves(RunResult(Outcome.HANG, "x"))


def test_spin_timeouts_are_the_seeded_hazard_where_a_family_says_so():
    # barrier_layout's lost release / hoisted poll shows *only* as bounded spins giving up:
    # for that family a spin timeout is the detection, not a harness anomaly
    timed_out = RunResult(Outcome.MISMATCH, "x", metrics={"spin_timeouts": 132})
    assert Proof(anomalies=tuple(get_family("barrier_layout").harness_anomalies)).proves(timed_out)
    assert not Proof(anomalies=tuple(get_family("ordering").harness_anomalies)).proves(timed_out)


def test_overrides_change_the_static_expectation(frame, fake_target):
    # a fixed variant pushed into a hazardous point is not expected clean any more
    r = stress_variant(get_family("pipeline"), "fixed", frame=frame, launches=1, requests=1,
                       target=fake_target, overrides={"wait_depth": 3})
    assert r.static_hazardous and r.expected is None and r.to_json()["expected"] == "n/a"


def test_hazards_stress_rejects_bad_input_in_one_line(capsys):
    from hazards.cli import main

    assert main(["stress", "pipeline", "--variant", "nope"]) == 2
    assert main(["stress", "pipeline", "--sanitizer", "helgrind"]) == 2
    assert main(["stress", "pipeline", "--set", "stages"]) == 2
    assert main(["stress", "earlyclobber"]) == 2
    err = capsys.readouterr().err
    assert err.count("hazards: error:") == 4 and "Traceback" not in err


def test_hazards_list_json_names_every_canary(capsys):
    import json

    from hazards.cli import main

    assert main(["list", "--json"]) == 0
    fams = {f["name"]: f for f in json.loads(capsys.readouterr().out)["families"]}
    canaries = {v["name"] for v in fams["pipeline"]["variants"] if v["canary"]}
    assert canaries == {"broken_war", "broken_wait", "broken_tail"}
    assert all(v["static"]["hazardous"] == v["canary"] for f in ("pipeline", "ordering")
               for v in fams[f]["variants"])


def test_the_static_model_judges_the_point_the_binary_reports_it_ran(frame):
    fam = get_family("pipeline")
    ran = {**fam.resolve({"variant": "fixed"}), "wait_depth": 2}  # a binary whose idea differs
    with ServerTarget([*HARNESS, "--resolved", json.dumps(ran)], name="fake") as target:
        r = stress_variant(fam, "fixed", frame=frame, launches=5, requests=1, target=target)
    assert fam.static_model({"variant": "fixed"}).hazardous is False
    assert r.static_hazardous is True and "wait_group 2" in r.static_reason
    # nothing is expected of a fixed variant at a hazardous point, and the campaign says so
    assert r.expected is None and frame.store.campaign(r.summary.campaign_id).spec["items"][0]["expect"] is None


class _Hangs:
    """A ready-made target whose every run hangs (no reply, so no launch count)."""

    name = "hangs"

    def run(self, params=None, *, timeout, launches=None, artifact_dir=None, **_):
        return RunResult(Outcome.HANG, f"no reply within {timeout:g} s", duration_s=timeout)

    def close(self) -> None:
        pass


def test_a_hung_run_is_one_failed_launch_in_stress_as_in_check_and_soak(frame):
    from hazards.engine.evidence import Evidence
    from hazards.engine.stats import format_rate

    r = stress_variant(get_family("pipeline"), "fixed", frame=frame, launches=50, requests=1, target=_Hangs(),
                       timeout=0.5)
    d = r.to_json()
    assert (d["launches"], d["failed_launches"], d["launch_rate"]) == (1, 1, 1.0)  # not "n/a": 0 launches
    check_and_soak = Evidence()
    check_and_soak.add(RunResult(Outcome.HANG, "x"))
    assert check_and_soak.launch_rate_text() == r.evidence.launch_rate_text() == format_rate(1, 1)


def test_stress_and_check_make_a_variants_work_item_by_one_recipe(monkeypatch):
    # a family whose static model calls even the clean variant's preset hazardous: check used
    # to expect it clean while stress only counted it (two recipes); now both ask the model once
    import dataclasses

    from hazards import checkrun, stress_family
    from hazards.family import StaticVerdict
    from tests.campaign.campaign_fakes import make_family

    calls = []

    def model(params):
        calls.append(dict(params))
        return StaticVerdict(True, "every point hazardous")

    fam = dataclasses.replace(make_family(), static_model=model)
    monkeypatch.setattr(stress_family, "family_binary", lambda family, **_: Path(sys.executable))
    from_stress = stress_family.family_item(fam, "fixed")
    assert calls == [{"variant": "fixed"}]  # resolved once
    [from_check] = checkrun.family_items(fam, [fam.variant("fixed")], checkrun.default_items_for)
    assert from_stress == from_check and from_stress.expect is None
    assert from_stress.anomalies == tuple(fam.harness_anomalies) and from_stress.target == fam.name


@pytest.mark.parametrize("fake_gpus", ["0", None], ids=["fake GPU", "no GPU"])
def test_stress_whose_server_cannot_start_on_this_machine_is_not_judged(monkeypatch, tmp_path, capsys, fake_gpus):
    # no usable GPU: the family server dies in its CUDA init before the handshake. That is
    # "could not judge" (exit 3, docs/cli.md), as the error runs would have been; not bad input (2)
    from hazards import stress_family
    from hazards.cli import main
    from hazards.engine.errors import EXIT_NOT_JUDGED
    from hazards.engine.loop import WorkItem
    import hazards.families as families
    from tests.campaign.campaign_fakes import make_family

    if fake_gpus is None:
        monkeypatch.delenv("HZ_FAKE_GPUS", raising=False)
    else:
        monkeypatch.setenv("HZ_FAKE_GPUS", fake_gpus)
    monkeypatch.setenv("HZ_LEASE_DIR", str(tmp_path / "leases"))
    dies = (sys.executable, "-c", "import sys; sys.exit('hz: device init failed: cudaErrorNoDevice')")
    monkeypatch.setattr(families, "get_family", lambda name: make_family())
    monkeypatch.setattr(stress_family, "family_item",
                        lambda fam, *a, **kw: WorkItem(target=fam.name, variant="broken", kind="server", argv=dies,
                                                       timeout_s=5.0))
    rc = main(["stress", "fakefam", "--store", str(tmp_path / "r.db"), "--no-forensics"])
    err = capsys.readouterr().err
    assert rc == EXIT_NOT_JUDGED, err
    assert err.count("\n") == 1 and "device init failed" in err
