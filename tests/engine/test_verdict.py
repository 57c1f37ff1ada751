"""The one verdict vocabulary: expectation + proved failures -> one Verdict with a sentence."""
from __future__ import annotations

import pytest

from hazards.engine.loop import WorkItem
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.verdict import Expect, ItemTally, Proof, Verdict, expect_of, judge


def tally(*outcomes: str, proof: Proof = Proof(), metrics: dict | None = None) -> ItemTally:
    t = ItemTally()
    for o in outcomes:
        t.add(RunResult(Outcome(o), "x", metrics=dict(metrics or {})), proof)
    return t


@pytest.mark.parametrize("expect, outcomes, verdict", [
    (Expect.DETECT, ["clean", "mismatch"], Verdict.DETECTED),
    (Expect.DETECT, ["clean", "clean"], Verdict.WENT_BLIND),
    (Expect.CLEAN, ["clean", "clean"], Verdict.CLEAN),
    (Expect.CLEAN, ["clean", "hang"], Verdict.FAILED),
    (None, ["fault"], Verdict.DETECTED),   # nothing expected: counted, never a failure
    (None, ["clean"], Verdict.CLEAN),
    (Expect.DETECT, ["error", "error"], Verdict.ERROR),
    (Expect.CLEAN, [], Verdict.ERROR),     # never run: not a pass
])
def test_expectation_and_runs_give_one_verdict(expect, outcomes, verdict):
    j = judge(expect, tally(*outcomes))
    assert j.verdict is verdict and j.ok is (verdict in (Verdict.DETECTED, Verdict.CLEAN))


def test_a_canary_is_detected_only_by_failures_its_proof_accepts():
    spins = Proof(anomalies=("spin_timeouts",))
    t = tally("mismatch", "mismatch", proof=spins, metrics={"spin_timeouts": 3})
    assert (t.failures, t.proved, t.unproved) == (2, 0, 2)
    j = judge(Expect.DETECT, t)
    assert j.verdict is Verdict.WENT_BLIND and "2 failed for another reason" in j.message
    # the same failures on an item expected clean are failures all the same
    assert judge(Expect.CLEAN, t).verdict is Verdict.FAILED


def test_only_the_sanitizers_own_error_proves_a_sanitizer_detection():
    race = Proof(sanitizer="racecheck")
    assert race.proves(RunResult(Outcome.FAULT, "x", error_kind="sanitizer_race"))
    assert not race.proves(RunResult(Outcome.FAULT, "x", error_kind="sanitizer_memcheck"))
    assert not race.proves(RunResult(Outcome.HANG, "slowed-down kernel timed out"))


def test_sprt_decision_and_dropping_change_the_sentence_not_the_rule():
    assert judge(Expect.DETECT, tally("clean"), decision="accept_h0").message == \
        "0 failures in 1 runs (SPRT accepted the blind rate)"
    assert "below the expected detection rate" in judge(Expect.DETECT, tally("mismatch"), decision="accept_h0").message
    j = judge(Expect.CLEAN, tally("clean", "error"), dropped="3 errors in a row")
    assert j.verdict is Verdict.ERROR and "repeated errors" in j.message


def test_lines_and_junit_cases_use_the_verdict_words():
    j = judge(Expect.DETECT, tally("clean"))
    assert j.line("fam/broken", Expect.DETECT) == "FAIL fam/broken [canary] went blind: 0 failures in 1 runs (budget ended)"
    case = j.junit_case("fam/broken (canary)", "hazards.check.fam")
    assert (case.status, case.type) == ("failure", "went-blind")
    assert judge(Expect.CLEAN, tally("clean", "fault")).junit_case("x", "y").type == "failed"
    assert judge(Expect.CLEAN, tally("error")).junit_case("x", "y").status == "error"


def test_work_items_carry_an_expectation_not_a_role_and_old_specs_still_read():
    item = WorkItem(target="fam", variant="broken", expect="detect", anomalies=("spin_timeouts",))
    again = WorkItem.from_json(item.to_json())
    assert again == item and again.expectation is Expect.DETECT and again.proof.anomalies == ("spin_timeouts",)
    assert WorkItem.from_json({"target": "t", "role": "canary"}).expectation is Expect.DETECT
    assert WorkItem.from_json({"target": "t", "role": "target"}).expectation is Expect.CLEAN
    assert WorkItem.from_json({"target": "t", "role": "broken"}).expectation is None
    assert expect_of("detect") is Expect.DETECT and expect_of(None) is None
