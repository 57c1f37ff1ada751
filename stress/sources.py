"""Work sources: what each leased GPU's loop runs next, and when a campaign is done.

A work source (`hazards.engine.executor.WorkSource`) answers `next_item(gpu)` (None: nothing
left), hears `report(item, result)` after every run, and says `finished()`; it must be
thread-safe (every GPU's loop calls it). A source that ends a campaign early says why in
`stop_reason` (the campaign is then 'stopped', not 'complete').

- `Repeat` (run, repro, stress): one item `n` times, stored runs of a resumed campaign
  included; stops at the first failure (`until_fail`) or on an SPRT decision.
- `Rotation` (soak): every item again and again, the one with the least GPU time first.
- `SprtStop` (check): each item until its sequential test decides.

Every source also says what it plans (`items`, and `total`: the runs it makes at most, None
when only the budget bounds it), which progress displays show.

A target that cannot even start produces `error` runs; `Rotation` and `SprtStop` stop
issuing an item after a few consecutive errors so a broken item cannot eat the budget.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Iterable

from hazards.engine.executor import WorkItem
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.stats import Sprt
from hazards.engine.store import empty_counts
from hazards.engine.verdict import Expect, ItemTally

MAX_CONSECUTIVE_ERRORS = 3   # Rotation/SprtStop: an item with this many errors in a row is dropped
MAX_ERRORS_IN_A_ROW = 10     # Repeat: a campaign with this many error runs in a row stops


class Repeat:
    """One item again and again: `n` runs in all (the `prior` runs of a resumed campaign
    count), stopping early at the first failure (`until_fail`) or when `sprt` decides (the
    prior runs are seen first: a campaign that already met its stop condition runs nothing).

    `params(k)`, when given, makes the parameters of the campaign's k-th run (k from 1,
    prior runs included). `counts` are the outcome counts so far, prior runs included. A
    target that cannot even start (an `error` run of kind `target_start`) stops it too:
    the next run would not start either; so do `max_errors_in_a_row` error runs in a row
    in this session (a program with an import error would otherwise make `n` of them;
    0 never stops for errors).
    """

    def __init__(self, item: WorkItem, n: int, *, until_fail: bool = False, sprt: Sprt | None = None,
                 prior: Iterable[RunResult] = (), params: Callable[[int], dict[str, Any]] | None = None,
                 max_errors_in_a_row: int = MAX_ERRORS_IN_A_ROW) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n!r}")
        if max_errors_in_a_row < 0:
            raise ValueError(f"max_errors_in_a_row must be >= 0, got {max_errors_in_a_row!r}")
        self._mu = threading.Lock()
        self.item, self.n, self.until_fail, self.sprt, self.params = item, n, until_fail, sprt, params
        self.max_errors_in_a_row = max_errors_in_a_row
        self.counts = empty_counts()
        self.issued = self.ran_now = 0
        self.failed = False
        self.cannot_start: str | None = None
        self.errors_in_a_row = 0
        self.last_error = ""
        for result in prior:
            self._count(result)
            self.issued += 1

    def _count(self, result: RunResult) -> None:
        outcome = Outcome(result.outcome)
        self.counts[outcome.value] += 1
        self.failed = self.failed or outcome.is_failure
        if self.sprt is not None and outcome is not Outcome.ERROR:
            self.sprt.update(outcome.is_failure)

    @property
    def stop_reason(self) -> str | None:
        """'first failure' or 'SPRT <decision>' once the campaign should stop early."""
        if self.until_fail and self.failed:
            return "first failure"
        if self.sprt is not None and self.sprt.decision is not None:
            return f"SPRT {self.sprt.decision}"
        if self.cannot_start is not None:
            return f"the target cannot start: {self.cannot_start}"
        if self.max_errors_in_a_row and self.errors_in_a_row >= self.max_errors_in_a_row:
            return (f"{self.errors_in_a_row} runs in a row ended in `error`, the check failing rather than "
                    f"the program under test; last: {self.last_error}")
        return None

    @property
    def items(self) -> list[WorkItem]:
        return [self.item]

    @property
    def total(self) -> int:
        return self.n

    def next_item(self, gpu: str) -> WorkItem | None:
        with self._mu:
            if self.stop_reason is not None or self.issued >= self.n:
                return None
            self.issued += 1
            if self.params is None:
                return self.item
            return dataclasses.replace(self.item, params=self.params(self.issued))

    def report(self, item: WorkItem, result: RunResult) -> None:
        with self._mu:
            self._count(result)
            self.ran_now += 1
            if result.error_kind == "target_start":
                self.cannot_start = result.reason
            if Outcome(result.outcome) is Outcome.ERROR:
                self.errors_in_a_row += 1
                self.last_error = result.reason
            else:
                self.errors_in_a_row = 0

    def finished(self) -> bool:
        with self._mu:
            return self.stop_reason is not None or sum(self.counts.values()) >= self.n


@dataclasses.dataclass
class _ItemState:
    item: WorkItem
    runs: int = 0
    busy_s: float = 0.0
    in_flight: int = 0
    errors_in_a_row: int = 0
    dropped: str | None = None
    tally: ItemTally = dataclasses.field(default_factory=ItemTally)


class Rotation:
    """Every item again and again, the one that has had the least GPU time first (soak).

    Balancing time rather than run counts keeps a variant that hangs every time (each run
    costs its whole timeout) from starving the fast ones. `prior` seeds {key: (runs,
    seconds)} from stored runs, so a resumed campaign evens out what it already has. An
    item with MAX_CONSECUTIVE_ERRORS error runs in a row is dropped (see `dropped`).
    """

    def __init__(self, items: list[WorkItem], prior: dict[str, tuple[int, float]] | None = None) -> None:
        self._mu = threading.Lock()
        self.states = {i.key: _ItemState(i, *(prior or {}).get(i.key, (0, 0.0))) for i in items}

    def _eligible(self, st: _ItemState) -> bool:
        return st.dropped is None

    @property
    def items(self) -> list[WorkItem]:
        return [s.item for s in self.states.values()]

    total = None  # only the budget bounds a rotation

    def next_item(self, gpu: str) -> WorkItem | None:
        with self._mu:
            live = [s for s in self.states.values() if self._eligible(s)]
            if not live:
                return None
            # runs in flight count with the item's mean duration so far
            st = min(live, key=lambda s: (s.busy_s + s.in_flight * s.busy_s / max(1, s.runs), s.runs + s.in_flight))
            st.in_flight += 1
            return st.item

    def report(self, item: WorkItem, result: RunResult) -> None:
        with self._mu:
            st = self.states[item.key]
            st.in_flight -= 1
            st.runs += 1
            st.busy_s += max(0.0, result.duration_s or 0.0)
            outcome = Outcome(result.outcome)
            st.tally.add(result, item.proof)
            st.errors_in_a_row = st.errors_in_a_row + 1 if outcome is Outcome.ERROR else 0
            if st.errors_in_a_row >= MAX_CONSECUTIVE_ERRORS and st.dropped is None:
                st.dropped = f"{st.errors_in_a_row} errors in a row, last: {result.reason}"
            self._after(st, result)

    def _after(self, st: _ItemState, result: RunResult) -> None:
        """Hook for subclasses (SPRT bookkeeping); called under the lock."""

    def finished(self) -> bool:
        with self._mu:
            return not any(self._eligible(s) for s in self.states.values())

    def dropped(self) -> dict[str, str]:
        """{item key: why it stopped being run} for items dropped after repeated errors."""
        with self._mu:
            return {k: s.dropped for k, s in self.states.items() if s.dropped}


class SprtStop(Rotation):
    """Each item until its sequential test decides (check).

    `sprt_for(item)` gives a fresh `Sprt`; `stop_on_failure(item)` says whether one
    failure settles it (a clean variant that fails has failed the check). `max_runs`
    caps every item. `decision(key)` is 'accept_h1', 'accept_h0', 'failed', or None.
    For a canary (expect 'detect') only failures its proof accepts count as detections.
    """

    def __init__(self, items: list[WorkItem], sprt_for: Callable[[WorkItem], Sprt],
                 stop_on_failure: Callable[[WorkItem], bool] = lambda i: False, max_runs: int = 1000) -> None:
        super().__init__(items)
        self.sprts = {i.key: sprt_for(i) for i in items}
        self.stop_on_failure = stop_on_failure
        self.max_runs = max_runs
        self.failed: set[str] = set()

    def _eligible(self, st: _ItemState) -> bool:
        key = st.item.key
        return (st.dropped is None and key not in self.failed and self.sprts[key].decision is None
                and st.runs + st.in_flight < self.max_runs)

    def _after(self, st: _ItemState, result: RunResult) -> None:
        outcome = Outcome(result.outcome)
        if outcome is Outcome.ERROR:
            return  # our infrastructure: no evidence either way
        item = st.item
        seen = item.proof.proves(result) if item.expectation is Expect.DETECT else outcome.is_failure
        self.sprts[item.key].update(seen)
        if outcome.is_failure and self.stop_on_failure(item):
            self.failed.add(st.item.key)

    def decision(self, key: str) -> str | None:
        with self._mu:
            return "failed" if key in self.failed else self.sprts[key].decision


