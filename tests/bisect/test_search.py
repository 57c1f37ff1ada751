"""How `hazards bisect` decides, on simulated histories (the same `bisect` the command runs,
with Bernoulli draws for runs): the right culprit in at least 19 of 20 seeded repetitions
for a failure rate that jumps from 0% to 5%, 20% and 100% at a known commit, with commits
that do not build; refusals, undecided budgets and skipped ranges said as such."""
from __future__ import annotations

import pytest

from hazards.bisect.search import (LIKE_BAD, LIKE_GOOD, SKIPPED, Design, Judged, bisect)
from hazards.bisect.simulate import SimulatedSide, history

COMMITS, CULPRIT, UNBUILDABLE = 24, 15, (4, 9, 17)


@pytest.mark.parametrize("after", [0.05, 0.2, 1.0])
def test_the_right_culprit_in_19_of_20_seeded_repetitions(after):
    found, runs = 0, []
    for seed in range(20):
        side = SimulatedSide(history(COMMITS, CULPRIT, 0.0, after, UNBUILDABLE), seed=seed)
        b = bisect(COMMITS - 1, side, budget=10_000)
        found += b.status == "found" and b.culprit == CULPRIT
        runs.append(b.runs)
        assert b.runs == sum(side.runs_at.values())  # the runs it reports are the runs it made
    assert found >= 19, f"{found}/20 right at 0% -> {after:.0%}"
    print(f"\n0% -> {after:.0%}: {found}/20 right, runs spent {min(runs)}-{max(runs)}")


def test_runs_adapt_to_the_rates():
    def median_runs(after: float) -> float:
        runs = sorted(bisect(COMMITS - 1, SimulatedSide(history(COMMITS, CULPRIT, 0.0, after), seed=s),
                             budget=10_000).runs for s in range(9))
        return runs[4]

    every, most, few = median_runs(1.0), median_runs(0.2), median_runs(0.05)
    assert every < 60 < most < few  # a handful per commit for 0 -> 100%, hundreds in all for 0 -> 5%


def test_an_unbuildable_commit_is_skipped_and_its_neighbour_tried():
    side = SimulatedSide(history(COMMITS, CULPRIT, 0.0, 1.0, UNBUILDABLE), seed=1)
    b = bisect(COMMITS - 1, side, budget=10_000)
    skipped = [j.index for j in b.judged if j.verdict == SKIPPED]
    assert skipped and set(skipped) <= set(UNBUILDABLE)
    assert b.status == "found" and b.culprit == CULPRIT


def test_only_unbuildable_commits_before_the_first_bad_one_is_ambiguous():
    # 13 and 14 do not build; 15 is the culprit: 13, 14 or 15 may be the first bad commit.
    b = bisect(COMMITS - 1, SimulatedSide(history(COMMITS, CULPRIT, 0.0, 1.0, (13, 14)), seed=2), budget=10_000)
    assert b.status == "ambiguous" and b.culprit is None and b.confidence is None
    assert b.candidates == [13, 14, 15]


def test_a_bad_end_that_never_fails_is_refused():
    b = bisect(COMMITS - 1, SimulatedSide(history(COMMITS, CULPRIT, 0.0, 0.0), seed=3), budget=200)
    assert b.status == "refused" and "never failed in 100 runs" in b.reason
    assert b.judged == []  # nothing bisected


def test_a_bad_end_not_clearly_above_the_good_end_is_refused():
    b = bisect(COMMITS - 1, SimulatedSide(history(COMMITS, CULPRIT, 0.2, 0.2), seed=4), budget=10_000)
    assert b.status == "refused" and "is not clearly above the good end's" in b.reason and b.judged == []


def test_a_budget_too_small_for_the_rates_ends_undecided_with_the_range_left():
    b = bisect(COMMITS - 1, SimulatedSide(history(COMMITS, CULPRIT, 0.0, 0.05), seed=5), budget=330)
    assert b.status == "undecided" and b.culprit is None and b.confidence is None
    assert "budget of 330 runs was spent" in b.reason
    assert CULPRIT in b.candidates and b.runs <= 330


def test_confidence_is_the_chance_every_decision_was_right():
    d = Design(0.01, 0.2, alpha=0.01, beta=0.02)
    from hazards.bisect.search import Bisection

    b = Bisection("found", d, Judged(0, LIKE_GOOD), Judged(9, LIKE_BAD),
                  [Judged(4, LIKE_BAD), Judged(2, LIKE_GOOD), Judged(3, SKIPPED)], culprit=3)
    assert b.confidence == pytest.approx((1 - 0.01 / 0.98) * (1 - 0.02 / 0.99))


def test_the_design_takes_the_bad_rate_low_and_the_good_rate_high():
    d = Design.from_ends((0, 100), (8, 160))
    assert d.p1 < 8 / 160 and d.p0 >= d.p1 / 20 and d.p0 < d.threshold < d.p1
    assert 0.7 < Design.from_ends((0, 20), (8, 8)).p1 < 0.99  # 8 of 8 failed: 1 - 0.1 ** (1/8) = 0.75
    explicit = Design.from_ends((0, 20), (8, 8), threshold=0.05)
    assert (explicit.p0, explicit.p1) == (0.025, 0.1)
    with pytest.raises(ValueError):
        Design.from_ends((0, 20), (8, 8), threshold=0.7)
