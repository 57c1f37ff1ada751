"""Evidence allocation: canaries until they are seen failing, then one run in 50; every other
run to the clean item with the weakest per-launch bound (`EvidenceAllocation`), against the
uniform rotation it replaces; in the soak, rates per run and per launch."""
from __future__ import annotations

import sys

import pytest
from campaign_fakes import FAKE_SERVER, fake_items_for, make_family

from hazards.engine.campaign import LeasedCampaign
from hazards.engine.evidence import Evidence, launches_of
from hazards.engine.loop import WorkItem
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.soak import run_soak
from hazards.engine.sources import RECHECK_EVERY, EvidenceAllocation, Rotation, canary_sprt


def item(name: str, expect: str | None, launches: int) -> WorkItem:
    return WorkItem(target="fam", variant=name, expect=expect, launches=launches)


def reply(it: WorkItem, fails: bool) -> RunResult:
    """What a run of `it` gives: every launch mismatched, or all clean; 1 ms whatever it
    launches (a small batch's time is the request's overhead)."""
    n = it.launches or 1
    return RunResult(Outcome.MISMATCH if fails else Outcome.CLEAN, "x", target=it.target, variant=it.variant,
                     metrics={"launches": n, "mismatched": n if fails else 0}, duration_s=0.001)


def drive(source, runs: int, failing: set[str]) -> dict[str, Evidence]:
    """Run `runs` items from `source` (one GPU), counting what each got."""
    ev: dict[str, Evidence] = {}
    for _ in range(runs):
        it = source.next_item("0")
        if it is None:
            break
        r = reply(it, it.variant in failing)
        source.report(it, r)
        ev.setdefault(it.variant, Evidence()).add(r)
    return ev


ITEMS = [item("canary_a", "detect", 100), item("canary_b", "detect", 100),
         item("one_launch", "clean", 1), item("batch", "clean", 100)]


def test_canaries_are_rechecked_at_one_run_in_fifty_after_their_first_detection():
    src = EvidenceAllocation(ITEMS, sprt_for=canary_sprt)
    ev = drive(src, 2000, failing={"canary_a", "canary_b"})
    assert ev["canary_a"].first_detection == 1 and ev["canary_b"].first_detection == 1
    reruns = ev["canary_a"].runs_after_detection + ev["canary_b"].runs_after_detection
    assert 2000 // RECHECK_EVERY - 2 <= reruns <= 2000 // RECHECK_EVERY + 2
    assert abs(ev["canary_a"].n - ev["canary_b"].n) <= 1  # the least recently checked first


def test_uniform_rotation_spends_a_share_on_canaries_that_evidence_does_not():
    uniform = drive(Rotation(ITEMS), 2000, failing={"canary_a", "canary_b"})
    reruns = sum(uniform[c].runs_after_detection for c in ("canary_a", "canary_b"))
    assert reruns > 0.2 * 2000  # equal GPU time: the canaries' share of the runs


def test_clean_items_per_launch_bounds_are_equalised_whatever_a_run_launches():
    ev = drive(EvidenceAllocation(ITEMS, sprt_for=canary_sprt), 3000, failing={"canary_a", "canary_b"})
    one, batch = ev["one_launch"], ev["batch"]
    assert one.n > 20 * batch.n  # a 1-launch item needs ~100x the runs of a 100-launch one
    assert one.launch_upper() / batch.launch_upper() == pytest.approx(1.0, rel=0.1)
    # the uniform rotation (equal time, here equal runs) leaves the 1-launch item's bound weaker
    # by about the share of runs it gets (1/4 against ~all)
    uni = drive(Rotation(ITEMS), 3000, failing={"canary_a", "canary_b"})
    assert uni["one_launch"].launch_upper() > 3 * max(one.launch_upper(), batch.launch_upper())


def test_a_blind_canary_is_settled_by_its_sprt_and_cannot_eat_the_budget():
    ev = drive(EvidenceAllocation(ITEMS, sprt_for=canary_sprt), 1000, failing={"canary_a"})
    blind = ev["canary_b"]
    assert blind.failures == 0 and 13 <= blind.n <= 13 + 1000 // RECHECK_EVERY + 1


def test_a_clean_item_that_failed_is_only_rechecked():
    ev = drive(EvidenceAllocation(ITEMS, sprt_for=canary_sprt), 1000, failing={"canary_a", "canary_b", "batch"})
    assert ev["batch"].failures == ev["batch"].n and ev["batch"].n <= 1000 // RECHECK_EVERY + 2


def test_with_a_target_bound_the_source_finishes_when_every_clean_bound_reaches_it():
    src = EvidenceAllocation(ITEMS, sprt_for=canary_sprt, target_bound=0.01, recheck=False)
    ev = drive(src, 100_000, failing={"canary_a", "canary_b"})
    assert src.finished() and src.next_item("0") is None
    assert ev["one_launch"].launch_upper() <= 0.01 and ev["batch"].launch_upper() <= 0.01
    assert ev["canary_a"].n == ev["canary_b"].n == 1  # seen, and (recheck off) not run again


def timed(it: WorkItem, per_launch_s: float, overhead_s: float = 0.004) -> RunResult:
    """A clean run of `it` that took `overhead_s` plus `per_launch_s` a launch."""
    n = it.launches or 1
    return RunResult(Outcome.CLEAN, "ok", target=it.target, variant=it.variant, metrics={"launches": n},
                     duration_s=overhead_s + n * per_launch_s)


def test_a_clean_items_requests_grow_to_the_request_time_its_runs_show():
    """check: a request of 200 launches of a 20-us kernel is mostly per-request cost; once a
    clean run shows what a launch costs, the item's requests last about `request_s`."""
    fast = WorkItem(target="fam", variant="fast", expect="clean", launches=200, timeout_s=20.0)
    slow = WorkItem(target="fam", variant="slow", expect="clean", launches=20, timeout_s=20.0)
    src = EvidenceAllocation([fast, slow], sprt_for=canary_sprt, recheck=False, request_s=0.25)
    cost = {"fast": 20e-6, "slow": 2e-3}
    sizes: dict[str, list[int]] = {"fast": [], "slow": []}
    for _ in range(40):
        it = src.next_item("0")
        sizes[it.variant].append(it.launches)
        src.report(it, timed(it, cost[it.variant]))
    assert sizes["fast"][0] == 200 and sizes["slow"][0] == 20  # before any run: the item's own
    # 0.25 s at the least per-launch time seen (overhead included: never past 0.25 s of launches)
    assert 200 * 20 < sizes["fast"][-1] <= 200 * 50 and sizes["fast"][-1] * 20e-6 <= 0.25
    assert 100 <= sizes["slow"][-1] <= 125
    bounds = {k: e.launch_upper() for k, e in src.evidence.items()}
    assert max(bounds.values()) / min(bounds.values()) < 1.5  # the allocation still equalises them


def test_grown_requests_stay_within_a_share_of_the_timeout_and_never_shrink_an_item():
    short = WorkItem(target="fam", variant="short_timeout", expect="clean", launches=10, timeout_s=0.4)
    src = EvidenceAllocation([short], sprt_for=canary_sprt, recheck=False, request_s=0.25)
    it = src.next_item("0")
    src.report(it, timed(it, 1e-3, overhead_s=0.0))
    grown = src.next_item("0")
    assert grown.launches == 100  # 0.25 x 0.4 s of the timeout at 1 ms a launch
    assert grown.timeout_s == pytest.approx(4.0)  # the same timeout per launch as the item's own
    slow = WorkItem(target="fam", variant="slower_than_the_request", expect="clean", launches=10, timeout_s=60)
    src = EvidenceAllocation([slow], sprt_for=canary_sprt, recheck=False, request_s=0.25)
    it = src.next_item("0")
    src.report(it, timed(it, 0.1))
    assert src.next_item("0").launches == 10


def test_canaries_failed_clean_items_and_a_soak_keep_their_items_launches():
    canary = WorkItem(target="fam", variant="broken", expect="detect", launches=100)
    failing = WorkItem(target="fam", variant="fixed", expect="clean", launches=100)
    src = EvidenceAllocation([canary, failing], sprt_for=canary_sprt, recheck=True, request_s=0.25)
    for _ in range(30):
        it = src.next_item("0")
        assert it.launches == 100, it
        r = timed(it, 1e-5) if it.variant == "broken" else reply(it, fails=True)
        src.report(it, r)
    soak = EvidenceAllocation([failing], sprt_for=canary_sprt)  # no request_s: soak's
    it = soak.next_item("0")
    soak.report(it, timed(it, 1e-5))
    assert soak.next_item("0").launches == 100


def test_launches_of_a_run_count_its_reply_or_one():
    assert launches_of(RunResult(Outcome.CLEAN, "ok", metrics={"launches": 200})) == (200, 0)
    assert launches_of(RunResult(Outcome.MISMATCH, "x", metrics={"launches": 200, "mismatched": 7})) == (200, 7)
    assert launches_of(RunResult(Outcome.HANG, "no reply")) == (1, 1)
    assert launches_of(RunResult(Outcome.CLEAN, "ok")) == (1, 0)  # a command: one launch
    assert launches_of(RunResult(Outcome.ERROR, "bad")) == (0, 0)


def command_item(name: str) -> WorkItem:
    """A clean command target: one launch per run (a process each), as a registered program."""
    return WorkItem(target=name, kind="command", expect="clean",
                    argv=(sys.executable, "-c", "print('HZ_RESULT {\"ok\": true}')"), timeout_s=20.0)


@pytest.mark.parametrize("allocation", ["evidence", "uniform"])
def test_soak_reports_rates_per_run_and_per_launch_and_canary_reruns(fake_gpus, store, allocation):
    fam = make_family()
    items = fake_items_for(fam, list(fam.variants))  # 10 launches per run on the fake server
    items[0].expect = items[1].expect = "clean"
    items[2].expect = "detect"
    with LeasedCampaign.acquire(store, "soak-test") as frame:
        res = run_soak(frame, items, budget_s=3.0, allocation=allocation)
    assert store.campaign(res.campaign_id).spec["allocation"] == allocation == res.allocation
    canary = res.evidence["fakefam/broken"]
    assert canary.first_detection == 1 and res.canary_reruns == canary.runs_after_detection
    share = res.canary_reruns / res.runs
    if allocation == "evidence":
        assert share < 0.05, res.evidence_lines()
    else:
        assert share > 0.2, res.evidence_lines()
    clean = res.evidence["fakefam/fixed"]
    assert clean.launches == 10 * clean.judged  # per launch, not per run
    text = "\n".join(res.evidence_lines())
    assert "per run" in text and "per launch" in text and "weakest clean bound" in text
    assert res.evidence_json()["worst_clean"]["item"] in ("fakefam/fixed", "fakefam/reference")


def test_soak_explore_share_runs_the_explorer_after_the_items_and_records_it(fake_gpus, store):
    fam = make_family()
    items = fake_items_for(fam, list(fam.variants))
    calls = []

    def explorer(frame, seconds):
        calls.append(seconds)
        return [{"family": "fakefam", "exit_code": 1, "disagreements": ["MODEL MISSED A HAZARD at {}"]}]

    with LeasedCampaign.acquire(store, "soak-test") as frame:
        res = run_soak(frame, items, budget_s=2.0, explore_share=0.25, explorer=explorer)
    assert calls == [pytest.approx(0.5)]
    assert store.campaign(res.campaign_id).spec["explored"][0]["family"] == "fakefam"
    assert res.explore_disagreements == ["fakefam: MODEL MISSED A HAZARD at {}"] and res.flagged
