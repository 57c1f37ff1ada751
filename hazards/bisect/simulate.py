"""A simulated `Side`: commits with known failure rates, runs drawn at random.

The statistics of `hazards bisect` are tested and its error rates and costs measured on
this (`tests/bisect/test_search.py`, `bench/bisect_sim.py`, docs/bisect.md): the same
`hazards.bisect.search.bisect` the real command runs, with Bernoulli draws for runs.
"""
from __future__ import annotations

import random

from hazards.engine.stats import Sprt
from hazards.bisect.search import LIKE_BAD, LIKE_GOOD, MEASURED, SKIPPED, UNDECIDED, Judged


class SimulatedSide:
    """Commit i fails each run with probability `rates[i]`; None: it does not build."""

    def __init__(self, rates: list[float | None], seed: int) -> None:
        self.rates = rates
        self.rng = random.Random(seed)
        self.runs_at: dict[int, int] = {}
        self.measured: dict[int, tuple[int, int]] = {}

    def _draw(self, index: int) -> bool:
        self.runs_at[index] = self.runs_at.get(index, 0) + 1
        return self.rng.random() < self.rates[index]

    def measure(self, index: int, until_failures: int, cap: int) -> Judged:
        """Cumulative, as stored runs are: a second call continues the first one's counts."""
        if self.rates[index] is None:
            return Judged(index, SKIPPED, why="does not build")
        k, n = self.measured.get(index, (0, 0))
        while n < cap and not (until_failures and k >= until_failures):
            k += self._draw(index)
            n += 1
        self.measured[index] = (k, n)
        return Judged(index, MEASURED, k, n)

    def judge(self, index: int, test: Sprt, cap: int) -> Judged:
        if self.rates[index] is None:
            return Judged(index, SKIPPED, why="does not build")
        while test.decision is None and test.n < cap:
            test.update(self._draw(index))
        verdict = {"accept_h1": LIKE_BAD, "accept_h0": LIKE_GOOD}.get(test.decision or "", UNDECIDED)
        return Judged(index, verdict, test.k, test.n)


def history(n_commits: int, culprit: int, before: float, after: float,
            unbuildable: tuple[int, ...] = ()) -> list[float | None]:
    """Rates of a history: `before` up to the culprit, `after` from it on, None where it does not build."""
    return [None if i in unbuildable else (after if i >= culprit else before) for i in range(n_commits)]
