"""Work sources: what each leased GPU's loop runs next, and when a campaign is done.

A work source (`hazards.engine.loop.WorkSource`) answers `next_item(gpu)` (None: nothing
left), hears `report(item, result)` after every run, and says `finished()`; it must be
thread-safe (every GPU's loop calls it). A source that ends a campaign early says why in
`stop_reason` (the campaign is then 'stopped', not 'complete'). More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Iterable

from .evidence import Evidence
from .loop import WorkItem
from .outcome import Outcome, RunResult
from .stats import Sprt
from .store import empty_counts
from .verdict import Expect, ItemTally

MAX_CONSECUTIVE_ERRORS = 3   # Rotation/EvidenceAllocation: an item with this many errors in a row is dropped
MAX_ERRORS_IN_A_ROW = 10     # Repeat: a campaign with this many error runs in a row stops
# A canary's sequential test (check, and the soak's evidence allocation): "blind" p0 = 0.1%
# against "detected" p1 = 30% per run, 1% error each way (13 clean runs accept blind).
CANARY_SPRT = (0.001, 0.3, 0.01, 0.01)


def canary_sprt(item: WorkItem | None = None) -> Sprt:
    """A fresh sequential test for a canary (`CANARY_SPRT`)."""
    return Sprt(*CANARY_SPRT)


class Repeat:
    """One item again and again: `n` runs in all (the `prior` runs of a resumed campaign
    count), stopping early at the first failure (`until_fail`), at the `until_failures`-th
    one, or when `sprt` decides (the prior runs are seen first: a campaign that already met
    its stop condition runs nothing).

    `params(k)`, when given, makes the parameters of the campaign's k-th run (k from 1,
    prior runs included). `counts` are the outcome counts so far, prior runs included. A
    target that cannot even start (an `error` run of kind `target_start`) stops it too:
    the next run would not start either; so do `max_errors_in_a_row` error runs in a row
    in this session (a program with an import error would otherwise make `n` of them;
    0 never stops for errors).
    """

    def __init__(self, item: WorkItem, n: int, *, until_fail: bool = False, until_failures: int = 0,
                 sprt: Sprt | None = None, prior: Iterable[RunResult] = (),
                 params: Callable[[int], dict[str, Any]] | None = None,
                 max_errors_in_a_row: int = MAX_ERRORS_IN_A_ROW) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n!r}")
        if max_errors_in_a_row < 0:
            raise ValueError(f"max_errors_in_a_row must be >= 0, got {max_errors_in_a_row!r}")
        if until_failures < 0:
            raise ValueError(f"until_failures must be >= 0, got {until_failures!r}")
        self._mu = threading.Lock()
        self.item, self.n, self.sprt, self.params = item, n, sprt, params
        self.until_failures = 1 if until_fail else until_failures  # 0: no such stop
        self.until_fail = self.until_failures == 1
        self.max_errors_in_a_row = max_errors_in_a_row
        self.counts = empty_counts()
        self.issued = self.ran_now = 0
        self.failed = False
        self.failures = 0
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
        self.failures += int(outcome.is_failure)
        if self.sprt is not None and outcome is not Outcome.ERROR:
            self.sprt.update(outcome.is_failure)

    @property
    def stop_reason(self) -> str | None:
        """'first failure', 'K failures' or 'SPRT <decision>' once the campaign should stop early."""
        if self.until_failures and self.failures >= self.until_failures:
            return "first failure" if self.until_failures == 1 else f"{self.failures} failures"
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


# A canary already seen failing gets one run in this many (all such canaries together, the
# least recently checked first): enough to notice, within the night, a rig that went blind
# (a server that stopped validating, a driver that masks the race), at 2% of the runs.
RECHECK_EVERY = 50
# EvidenceAllocation(request_s=...): a clean item's requests grow at most this many times its
# own launches, and never past this share of its timeout (a slow GPU still answers in time).
REQUEST_GROWTH_MAX = 50
REQUEST_TIMEOUT_SHARE = 0.25


class EvidenceAllocation:
    """Runs spent where evidence is thin (soak `--allocation evidence`; check's clean part).

    - A canary (expect 'detect') runs until a failure its proof accepts is seen, or its
      `sprt_for(item)` test accepts the blind rate (so a canary that went blind cannot eat
      the budget); undecided canaries go first.
    - Once decided, canaries, and clean items that failed (a hazard found: their rate is
      news, not a bound to tighten), are only re-checked: one run in `recheck_every` of the
      source's runs, the least recently run first.
    - Every other run goes to the clean item (expect 'clean', or None) whose per-launch
      upper bound is weakest, counting the runs in flight as clean at the item's mean
      launches per run: the bounds of items with 1 launch per run and with 1,000 per run
      are driven to the same level. With `target_bound`, an item whose bound is at or
      below it is satisfied, and the source is finished when every clean item is (and no
      canary is undecided).

    `prior` replays a resumed campaign's stored runs (in their order). An item with
    MAX_CONSECUTIVE_ERRORS error runs in a row is dropped (see `dropped`), as in `Rotation`.

    With `request_s`, a clean item's requests grow to about that many seconds once its
    clean runs show what a launch costs (`sized`): a request of 200 launches of a 20-us
    kernel is mostly the per-request cost (the supervisor's bookkeeping, the server's
    set-up), not evidence. The oracle is the same per launch; canaries, and clean items
    that failed, keep their item's launches.
    """

    def __init__(self, items: list[WorkItem], *, sprt_for: Callable[[WorkItem], Sprt],
                 recheck_every: int = RECHECK_EVERY, recheck: bool = True, target_bound: float | None = None,
                 prior: Iterable[RunResult] = (), conf: float = 0.95, request_s: float | None = None) -> None:
        if recheck_every < 1:
            raise ValueError(f"recheck_every must be >= 1, got {recheck_every!r}")
        if request_s is not None and not request_s > 0:
            raise ValueError(f"request_s must be positive, got {request_s!r}")
        self.request_s = request_s
        self.launch_s: dict[str, float] = {}  # the least seconds per launch a clean run of the item took
        self._mu = threading.Lock()
        self.by_key = {i.key: i for i in items}
        self.evidence = {k: Evidence() for k in self.by_key}
        self.sprts = {k: sprt_for(i) for k, i in self.by_key.items()}
        self.recheck_every, self.recheck, self.target_bound, self.conf = recheck_every, recheck, target_bound, conf
        self.in_flight = {k: 0 for k in self.by_key}
        self.errors_in_a_row = {k: 0 for k in self.by_key}
        self.last_run = {k: -1 for k in self.by_key}  # issue number of the item's last run
        self._dropped: dict[str, str] = {}
        self.issued = 0
        self.rechecks = 0
        self._since_recheck = 0
        for r in prior:
            if r.key in self.by_key:
                self._count(self.by_key[r.key], r)

    @property
    def items(self) -> list[WorkItem]:
        return list(self.by_key.values())

    total = None  # only the budget (or `target_bound`) bounds it

    # -- what an item needs ------------------------------------------------------------------
    def _canary(self, key: str) -> bool:
        return self.by_key[key].expect == "detect"

    def _decided(self, key: str) -> bool:
        """A canary seen failing, or one its SPRT judged blind."""
        return self.evidence[key].detected or self.sprts[key].decision is not None

    def _settled(self, key: str) -> bool:
        """Only re-checked from now on: a decided canary, or a clean item that failed."""
        if self._canary(key):
            return self._decided(key)
        return self.evidence[key].failures > 0

    def _bound(self, key: str) -> float:
        ev = self.evidence[key]
        return ev.launch_upper_if(round(self.in_flight[key] * ev.launches_per_run), self.conf)

    def _live(self, key: str) -> bool:
        return key not in self._dropped

    # -- the work source -------------------------------------------------------------------------
    def _pick(self) -> str | None:
        live = [k for k in self.by_key if self._live(k)]
        undecided = [k for k in live if self._canary(k) and not self._decided(k)]
        free = [k for k in undecided if not self.in_flight[k]]
        if free:
            return min(free, key=lambda k: (self.evidence[k].n, self.last_run[k]))
        key = self._pick_evidence(live)
        if key is None and undecided:  # nothing else to do: a second run of an undecided canary
            return min(undecided, key=lambda k: (self.in_flight[k], self.evidence[k].n))
        return key

    def _pick_evidence(self, live: list[str]) -> str | None:
        settled = [k for k in live if self._settled(k)] if self.recheck else []
        clean = [k for k in live if not self._canary(k) and not self._settled(k)]
        wanting = clean if self.target_bound is None else [k for k in clean if self._bound(k) > self.target_bound]
        recheck_due = self._since_recheck >= self.recheck_every - 1 or not clean
        if settled and recheck_due and (wanting or not clean):
            return min(settled, key=lambda k: (self.last_run[k], self.in_flight[k]))
        if not wanting:
            return None
        return max(wanting, key=lambda k: (self._bound(k), -self.evidence[k].n - self.in_flight[k]))

    def next_item(self, gpu: str) -> WorkItem | None:
        with self._mu:
            key = self._pick()
            if key is None:
                return None
            if self._settled(key):
                self.rechecks += 1
                self._since_recheck = 0
            else:
                self._since_recheck += 1
            self.issued += 1
            self.last_run[key] = self.issued
            self.in_flight[key] += 1
            return self.sized(key)

    def sized(self, key: str) -> WorkItem:
        """The item to run next for `key`: a clean item still gathering evidence, with
        `request_s`, gets requests of about that many seconds at the least per-launch time
        its clean runs showed (a run's time includes its per-request cost, so this never
        overshoots by it), at least its own launches, at most `REQUEST_GROWTH_MAX` times
        them and a `REQUEST_TIMEOUT_SHARE` of its timeout. The timeout grows with the
        launches: a GPU that slows down (another process on it) leaves a grown request the
        same margin per launch as the item's own (a hang is still found by its stall window,
        and the budget's cutoff still holds)."""
        item = self.by_key[key]
        per_launch = self.launch_s.get(key)
        if self.request_s is None or per_launch is None or self._canary(key) or self._settled(key):
            return item
        base = item.launches or 1
        most = min(base * REQUEST_GROWTH_MAX, int(item.timeout_s * REQUEST_TIMEOUT_SHARE / per_launch))
        n = max(base, min(int(self.request_s / per_launch), most))
        return item if n == base else dataclasses.replace(item, launches=n, timeout_s=item.timeout_s * n / base)

    def _count(self, item: WorkItem, result: RunResult) -> None:
        key = item.key
        self.evidence[key].add(result, item.proof)
        outcome = Outcome(result.outcome)
        launches = (result.metrics or {}).get("launches")
        if outcome is Outcome.CLEAN and isinstance(launches, int) and launches > 0 and result.duration_s > 0:
            per_launch = result.duration_s / launches
            self.launch_s[key] = min(per_launch, self.launch_s.get(key, per_launch))
        if outcome is not Outcome.ERROR and self._canary(key) and self.sprts[key].decision is None:
            self.sprts[key].update(item.proof.proves(result))
        self.errors_in_a_row[key] = self.errors_in_a_row[key] + 1 if outcome is Outcome.ERROR else 0
        if self.errors_in_a_row[key] >= MAX_CONSECUTIVE_ERRORS and key not in self._dropped:
            self._dropped[key] = f"{self.errors_in_a_row[key]} errors in a row, last: {result.reason}"

    def report(self, item: WorkItem, result: RunResult) -> None:
        with self._mu:
            self.in_flight[item.key] = max(0, self.in_flight[item.key] - 1)
            self._count(item, result)

    def finished(self) -> bool:
        with self._mu:
            return self._pick() is None

    def dropped(self) -> dict[str, str]:
        """{item key: why it stopped being run} for items dropped after repeated errors."""
        with self._mu:
            return dict(self._dropped)

    def decision(self, key: str) -> str | None:
        """A canary's SPRT decision ('accept_h1' / 'accept_h0', None while undecided)."""
        with self._mu:
            return self.sprts[key].decision


class DriverStopped(BaseException):
    """Raised inside a `Driven` source's driver when the loop has stopped (the budget ended,
    Ctrl-C): the driver must end now. A BaseException, so that a driver such as
    hypothesis does not take it for a failure of the code under test and shrink it."""


class Driven:
    """The items a driver asks for, one at a time, from its own thread (explore).

    `drive(ask)` runs in a thread the first time the loop wants an item; it calls
    `ask(item)` for each run it wants and gets that run's `RunResult` back (the loop ran it
    on a leased GPU, the sink committed it). When the driver returns, the source is
    finished. After `deadline` (time.monotonic()) or `close()`, `ask` raises
    `DriverStopped` in the driver. An exception the driver raises is kept in `error`;
    `close()` stops the driver and waits for its thread (call it after the loop, in a
    `finally`).
    """

    def __init__(self, drive: Callable[[Callable[[WorkItem], RunResult]], Any], *,
                 deadline: float = float("inf")) -> None:
        self._drive, self.deadline = drive, deadline
        self._cv = threading.Condition()
        self._asked: WorkItem | None = None
        self._answer: RunResult | None = None
        self._done = self._stopped = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.value: Any = None
        self.stop_reason: str | None = None

    def ask(self, item: WorkItem) -> RunResult:
        """Run `item` once on the loop and return its result (called by the driver)."""
        with self._cv:
            if self._stopped or time.monotonic() >= self.deadline:
                raise DriverStopped()
            self._asked, self._answer = item, None
            self._cv.notify_all()
            while self._answer is None and not self._stopped:
                self._cv.wait(0.5)
            if self._answer is None:
                raise DriverStopped()
            result, self._answer = self._answer, None
            return result

    def _body(self) -> None:
        try:
            self.value = self._drive(self.ask)
        except DriverStopped:
            pass
        except BaseException as e:  # kept for the caller; the loop must not hang on it
            self.error = e
        finally:
            with self._cv:
                self._done = True
                self._cv.notify_all()

    def next_item(self, gpu: str) -> WorkItem | None:
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._body, name="hz-driver", daemon=True)
                self._thread.start()
            while self._asked is None and not self._done and not self._stopped:
                self._cv.wait(0.5)
            item, self._asked = self._asked, None
            return item

    def report(self, item: WorkItem, result: RunResult) -> None:
        with self._cv:
            self._answer = result
            self._cv.notify_all()

    def finished(self) -> bool:
        with self._cv:
            return self._done

    def close(self) -> None:
        """Stop the driver (its next `ask` raises DriverStopped) and wait for its thread."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
