"""How `hazards bisect` decides: the ends, the per-commit sequential test, the search.

Runner-agnostic: every run is asked of a `Side` (the real one builds a commit in a worktree
and runs the test through the engine's loop, `hazards.bisect.session`; the tests' one draws
Bernoulli outcomes), so the statistics are the same code in both. More in docs/bisect.md.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Protocol

from hazards.engine.stats import Sprt, fisher_one_sided, format_rate, rate_ci, upper_bound

END_FAILURES = 8        # the bad end runs until this many failures (its rate to ~35 % relative)
MIN_GOOD_RUNS = 20      # the good end runs at least this many times
END_ALPHA = 0.05        # the bad end is "clearly above" the good end at this one-sided level, in all
END_LOOKS = 3           # looks at the ends (8, 16, 32 failures), each at END_ALPHA / END_LOOKS (Bonferroni)
P0_RATIO = 20.0         # p0 is at least p1 / P0_RATIO
P1_CONF = 0.9           # p1: the bad end's one-sided lower bound at this confidence
P0_CONF = 0.5           # p0: the good end's one-sided upper bound at this confidence (median-unbiased)
P1_MAX = 0.99           # a bad end that always failed: p1 = 0.99 (the SPRT needs p1 < 1)
DEFAULT_ALPHA = 0.01
DEFAULT_BETA = 0.01
END_SHARE = 0.5         # the bad end may spend at most this share of the budget

LIKE_GOOD, LIKE_BAD, UNDECIDED, SKIPPED = "like good", "like bad", "undecided", "skipped"
MEASURED = "measured"  # an end: its rate measured, not judged (the user said which end it is)


class Refused(Exception):
    """The ends do not allow a bisection (one line: why)."""


@dataclasses.dataclass(frozen=True)
class Design:
    """The per-commit sequential test: H0 rate p0 ("like good") vs H1 rate p1 ("like bad")."""

    p0: float
    p1: float
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA

    @classmethod
    def from_ends(cls, good: tuple[int, int], bad: tuple[int, int], *, threshold: float | None = None,
                  alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA) -> "Design":
        """From the ends' (failures, runs), or around an explicit `threshold` rate."""
        if threshold is not None:
            if not 0.0 < threshold < 0.5:
                raise ValueError(f"the rate threshold must be in (0, 0.5), got {threshold!r}")
            return cls(threshold / 2.0, min(2.0 * threshold, P1_MAX), alpha, beta)
        (kg, ng), (kb, nb) = good, bad
        p1 = min(rate_ci(kb, nb, 2.0 * P1_CONF - 1.0)[0], P1_MAX)
        p0 = max(upper_bound(kg, ng, P0_CONF), p1 / P0_RATIO)
        if not p0 < p1:
            raise Refused(f"the good end's rate ({format_rate(kg, ng)}) is not below the bad end's "
                          f"({format_rate(kb, nb)})")
        return cls(p0, p1, alpha, beta)

    def sprt(self) -> Sprt:
        """A fresh test for one commit."""
        return Sprt(self.p0, self.p1, self.alpha, self.beta)

    @property
    def threshold(self) -> float:
        """The rate at which the test drifts neither way (where it is least sure)."""
        a = math.log(self.p1 / self.p0)
        b = math.log((1.0 - self.p0) / (1.0 - self.p1))
        return b / (a + b)

    def error_of(self, decision: str) -> float:
        """Wald's bound on the chance that `decision` is wrong."""
        if decision == LIKE_BAD:
            return self.alpha / (1.0 - self.beta)
        if decision == LIKE_GOOD:
            return self.beta / (1.0 - self.alpha)
        return 1.0

    def to_json(self) -> dict[str, float]:
        return {"p0": self.p0, "p1": self.p1, "alpha": self.alpha, "beta": self.beta, "threshold": self.threshold}


@dataclasses.dataclass
class Judged:
    """What one commit's runs said."""

    index: int
    verdict: str          # LIKE_GOOD, LIKE_BAD, UNDECIDED, SKIPPED; MEASURED for an end
    failures: int = 0
    runs: int = 0         # judged runs (error runs excluded)
    why: str = ""         # a skip's reason


class Side(Protocol):
    """Where the runs come from. `measure` runs commit `index` until `until_failures`
    failures (0: no such stop) or `cap` judged runs, its stored runs counted; `judge` runs
    it until `test` decides or `cap` judged runs; both return a `Judged` (verdict SKIPPED
    when the commit does not build or cannot run)."""

    def measure(self, index: int, until_failures: int, cap: int) -> Judged: ...
    def judge(self, index: int, test: Sprt, cap: int) -> Judged: ...


@dataclasses.dataclass
class Bisection:
    """The outcome of `bisect`: `status` is 'found', 'ambiguous' (skipped commits hide
    which of `candidates` it is), 'undecided' (the budget ran out) or 'refused'."""

    status: str
    design: Design | None
    good_end: Judged
    bad_end: Judged
    judged: list[Judged]            # in the order tested, ends excluded
    culprit: int | None = None      # index into the commit list
    candidates: list[int] = dataclasses.field(default_factory=list)  # where it may be (not 'found')
    before: Judged | None = None    # the nearest commit judged like good before the culprit (or the good end)
    reason: str = ""
    end_p: float | None = None      # the ends' one-sided Fisher p-value

    @property
    def runs(self) -> int:
        return self.good_end.runs + self.bad_end.runs + sum(j.runs for j in self.judged)

    @property
    def confidence(self) -> float | None:
        """The chance that every decision was right (a lower bound; None unless 'found')."""
        if self.status != "found" or self.design is None:
            return None
        conf = 1.0
        for j in self.judged:
            if j.verdict in (LIKE_GOOD, LIKE_BAD):
                conf *= 1.0 - self.design.error_of(j.verdict)
        return conf


def bisect(last: int, side: Side, *, budget: int, threshold: float | None = None,
           alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA) -> Bisection:
    """Bisect commits 0 (the good end) .. `last` (the bad end) with at most `budget` judged
    runs in all. Deterministic given the runs: a resumed bisection whose `side` replays the
    stored runs takes the same path and runs only what is missing."""
    if last < 1:
        raise ValueError("need at least the two ends")
    bad_cap = max(1, int(budget * END_SHARE))
    for look in range(END_LOOKS):  # the ends' evidence doubles at each look (their stored runs count)
        bad = side.measure(last, END_FAILURES << look, bad_cap)
        if bad.verdict == SKIPPED:
            return Bisection("refused", None, Judged(0, UNDECIDED), bad, [],
                             reason=f"the bad end cannot be tested: {bad.why}")
        if bad.failures == 0:
            return Bisection("refused", None, Judged(0, UNDECIDED), bad, [],
                             reason=f"the bad end never failed in {bad.runs} runs: nothing to bisect")
        good = side.measure(0, 0, max(bad.runs, MIN_GOOD_RUNS))
        if good.verdict == SKIPPED:
            return Bisection("refused", None, good, bad, [], reason=f"the good end cannot be tested: {good.why}")
        p = fisher_one_sided(bad.failures, bad.runs, good.failures, good.runs)
        if p < END_ALPHA / END_LOOKS or bad.runs >= bad_cap:
            break
    if p >= END_ALPHA / END_LOOKS:
        return Bisection("refused", None, good, bad, [], end_p=p, reason=(
            f"the bad end's failure rate, {format_rate(bad.failures, bad.runs)}, is not clearly above the "
            f"good end's, {format_rate(good.failures, good.runs)} (one-sided Fisher p = {p:.2g}, "
            f"needs < {END_ALPHA / END_LOOKS:.2g})"))
    try:
        design = Design.from_ends((good.failures, good.runs), (bad.failures, bad.runs), threshold=threshold,
                                  alpha=alpha, beta=beta)
    except Refused as e:
        return Bisection("refused", None, good, bad, [], end_p=p, reason=str(e))
    lo, hi = 0, last
    verdicts = {0: good, last: bad}
    judged: list[Judged] = []
    skipped: set[int] = set()
    spent = good.runs + bad.runs
    while True:
        open_ = [i for i in range(lo + 1, hi) if i not in skipped]
        if not open_:
            break
        mid = min(open_, key=lambda i: (abs(2 * i - lo - hi), i))
        j = side.judge(mid, design.sprt(), max(0, budget - spent))
        judged.append(j)
        spent += j.runs
        if j.verdict == SKIPPED:
            skipped.add(mid)
            continue
        if j.verdict == UNDECIDED:
            return Bisection("undecided", design, good, bad, judged, candidates=list(range(lo + 1, hi + 1)),
                             end_p=p, reason=f"the budget of {budget} runs was spent while commit {mid} was undecided "
                                             f"({format_rate(j.failures, j.runs)})")
        verdicts[mid] = j
        if j.verdict == LIKE_BAD:
            hi = mid
        else:
            lo = mid
    if hi - lo > 1:  # only skipped commits between the last good and the first bad
        return Bisection("ambiguous", design, good, bad, judged, candidates=list(range(lo + 1, hi + 1)), end_p=p,
                         reason=f"{hi - lo - 1} commit(s) before the first bad one could not be tested")
    return Bisection("found", design, good, bad, judged, culprit=hi, before=verdicts[lo], end_p=p)
