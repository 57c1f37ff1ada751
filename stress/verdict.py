"""One vocabulary for what a check concluded about an item: its verdict.

An item (a family variant, a registered target, a user's command) comes with an
expectation: `Expect.DETECT` (a canary: its seeded hazard must be seen) or `Expect.CLEAN`
(it must never fail), or none (its runs are only counted). Its runs are tallied with a
`Proof`, which says what makes a failing run count as seeing the hazard (a sanitizer
error under a sanitizer; under stress, a failure whose harness reported none of its own
machinery going wrong). `judge` turns expectation and tally into one `Verdict` with a
sentence. `hazards check`, `soak`, `stress`, `report` and their JUnit files all judge
here, so the same runs get the same word everywhere.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Iterable

from .errors import EXIT_HAZARD, EXIT_NOT_JUDGED, EXIT_OK
from .junit import JUnitCase
from .outcome import Outcome, RunResult
from .stats import upper_bound
from .store import OutcomeCounts, Store, empty_counts


class Verdict(str, enum.Enum):
    """What a check concluded about one item."""

    DETECTED = "detected"      # the hazard was seen (a canary: by a failure its oracle proved)
    WENT_BLIND = "went blind"  # a canary judged and never proved failing: the check cannot see
    CLEAN = "clean"            # no judged run failed
    FAILED = "failed"          # an item expected clean failed: a hazard
    REGRESSED = "regressed"    # worse than before (soak): a failure never seen before in the store,
                               # a failure rate that rose, a canary's detection rate that dropped
    KNOWN = "known hazard"     # (soak) failed as before: every failure signature seen in an earlier
                               # campaign and the rate not significantly higher than the last soak's
    ERROR = "error"            # nothing could be judged (only errors, dropped, never run, no GPU)
    SKIPPED = "skipped"        # deliberately not run: the user asked (--skip)

    def __str__(self) -> str:
        return self.value

    @property
    def ok(self) -> bool:
        """Whether this verdict lets a check pass."""
        return self in (Verdict.DETECTED, Verdict.CLEAN, Verdict.SKIPPED, Verdict.KNOWN)

    @property
    def junit_type(self) -> str:
        """The verdict as a JUnit failure/error type (no spaces)."""
        return self.value.replace(" ", "-")

    @property
    def is_hazard(self) -> bool:
        """Whether this verdict means something was seen that fails a check (exit 1)."""
        return self in (Verdict.WENT_BLIND, Verdict.FAILED, Verdict.REGRESSED)


def exit_code(verdicts: Iterable[Verdict]) -> int:
    """The exit status a set of verdicts gives: 1 when one is a hazard (a canary that went
    blind, a clean item that failed), else 3 when one could not be judged (error), else 0."""
    verdicts = list(verdicts)
    if any(v.is_hazard for v in verdicts):
        return EXIT_HAZARD
    return EXIT_NOT_JUDGED if Verdict.ERROR in verdicts else EXIT_OK


class Expect(str, enum.Enum):
    """What a correct check must report for an item."""

    DETECT = "detect"  # a canary
    CLEAN = "clean"

    def __str__(self) -> str:
        return self.value

    @property
    def noun(self) -> str:
        """How reports name an item with this expectation: 'canary' or 'clean'."""
        return "canary" if self is Expect.DETECT else "clean"


# Role words of campaign specs written before expectations existed.
_LEGACY_ROLES = {"canary": Expect.DETECT, "clean": Expect.CLEAN, "target": Expect.CLEAN}


def expect_of(value: Any) -> Expect | None:
    """An `Expect` from its word (or a stored spec's legacy role word); None for none."""
    if isinstance(value, Expect) or value in ("detect", "clean"):
        return Expect(value)
    return _LEGACY_ROLES.get(value) if isinstance(value, str) else None


@dataclasses.dataclass(frozen=True)
class Proof:
    """What makes a failing run count as seeing the hazard an item is run for.

    `sanitizer`: the item runs under that compute-sanitizer tool, and only that tool's
    error proves anything (a kernel mismatch or a timeout of the instrumented, slowed-down
    kernel does not). Otherwise any hang, fault or mismatch proves it, unless the run's
    metrics report one of the `anomalies` (> 0): counters of the harness's own machinery
    going wrong, such as a bounded spin that gave up.
    """

    sanitizer: str | None = None
    anomalies: tuple[str, ...] = ()

    def proves(self, result: RunResult) -> bool:
        """Did this run fail because of the hazard this proof looks for?"""
        if not Outcome(result.outcome).is_failure:
            return False
        if self.sanitizer is not None:
            from .targets.sanitizer import ERROR_KINDS

            kind = result.error_kind or (result.evidence or {}).get("error_kind")
            return kind == ERROR_KINDS.get(self.sanitizer)
        metrics = result.metrics or {}
        return not any(_positive(metrics.get(k)) for k in self.anomalies)


def _positive(value: Any) -> bool:
    try:
        return float(value or 0) > 0
    except (TypeError, ValueError):
        return False


@dataclasses.dataclass
class ItemTally(OutcomeCounts):
    """One item's runs: outcome counts, and how many failures its proof accepted."""

    counts: dict[str, int] = dataclasses.field(default_factory=empty_counts)
    proved: int = 0    # failing runs the proof accepted
    unproved: int = 0  # failing runs it did not (a harness anomaly, a sanitizer-side timeout)

    def add(self, result: RunResult, proof: Proof = Proof()) -> None:
        """Count one run."""
        outcome = Outcome(result.outcome)
        self.counts[outcome.value] += 1
        if outcome.is_failure:
            if proof.proves(result):
                self.proved += 1
            else:
                self.unproved += 1


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A verdict with the sentence that says why."""

    verdict: Verdict
    message: str

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def line(self, label: str, expect: Expect | None) -> str:
        """'ok   fam/variant [canary] detected: 3/3 runs failed: mismatch 3' (one per item)."""
        mark = ("skip" if self.verdict is Verdict.SKIPPED else "note" if self.verdict is Verdict.KNOWN
                else "ok  " if self.ok else "FAIL")
        noun = f" [{expect.noun}]" if expect is not None else ""
        return f"{mark} {label}{noun} {self.verdict}: {self.message}"

    def junit_case(self, name: str, classname: str, time_s: float = 0.0) -> JUnitCase:
        """This judgement as a JUnit test case: passed, failure, error or skipped."""
        case = JUnitCase(name, classname, time_s)
        if self.verdict is Verdict.SKIPPED:
            case.status, case.message = "skipped", self.message
        elif self.verdict is Verdict.ERROR:
            case.status, case.message, case.type = "error", self.message, self.verdict.junit_type
        elif not self.ok:
            case.status, case.message, case.type = "failure", self.message, self.verdict.junit_type
        return case


def judge(expect: Expect | None, tally: ItemTally, *, decision: str | None = None,
          dropped: str | None = None) -> Judgement:
    """The verdict on one item from its expectation and its runs.

    `decision` is an SPRT decision ('accept_h0', 'accept_h1') where one ran; `dropped`
    says why the item stopped being run after repeated errors. An item with no judged run
    is an `error`, never a pass; a canary is `detected` only by failures its proof accepted.
    """
    judged, failures = tally.judged, tally.failures
    detail = ", ".join(f"{o} {n}" for o, n in tally.counts.items() if n) or "no runs"
    if dropped:
        return Judgement(Verdict.ERROR, f"stopped after repeated errors ({dropped})")
    if judged == 0:
        return Judgement(Verdict.ERROR, f"no judged run ({detail})" if tally.errors
                         else "not run: the budget ended first")
    others = f"; {tally.unproved} failed for another reason" if tally.unproved else ""
    if expect is Expect.DETECT:
        if tally.proved:
            weak = " (below the expected detection rate)" if decision == "accept_h0" else ""
            return Judgement(Verdict.DETECTED, f"{tally.proved}/{judged} runs failed{weak}: {detail}{others}")
        why = "SPRT accepted the blind rate" if decision == "accept_h0" else "budget ended"
        if failures:
            return Judgement(Verdict.WENT_BLIND, f"no failure its oracle proved in {judged} runs "
                             f"({failures} failed for another reason: {detail}; {why})")
        return Judgement(Verdict.WENT_BLIND, f"0 failures in {judged} runs ({why})")
    if failures:
        verdict = Verdict.FAILED if expect is Expect.CLEAN else Verdict.DETECTED
        return Judgement(verdict, f"{failures}/{judged} runs failed: {detail}")
    return Judgement(Verdict.CLEAN, f"0/{judged} failures; rate <= {upper_bound(0, judged):.2g} at 95%")


def campaign_tallies(store: Store, campaign_id: int, proofs: dict[str, Proof]) -> dict[str, ItemTally]:
    """{target/variant: ItemTally} of a campaign's stored runs, each counted with its proof
    (`proofs[key]`; the default `Proof()` for keys it does not name)."""
    tallies: dict[str, ItemTally] = {}
    for sr in store.iter_runs(campaign_id):
        key = sr.result.key
        tallies.setdefault(key, ItemTally()).add(sr.result, proofs.get(key, Proof()))
    return tallies


def skipped(why: str) -> Judgement:
    """The judgement of an item that was deliberately not run."""
    return Judgement(Verdict.SKIPPED, why)


def not_judged(why: str) -> Judgement:
    """The judgement of an item that could not be run at all (a build failure, no lease)."""
    return Judgement(Verdict.ERROR, why)
