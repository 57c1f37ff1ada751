"""`hazards explore FAMILY`: hypothesis over a family's space, its static model the two-way oracle.

Each example is a parameter point drawn from the family's strategy (`Family.strategy()`),
run on the family's warm launch server through the one loop: the leased-campaign frame
runs a `Driven` work source whose driver is hypothesis (`hazards.engine.sources.Driven`),
so every run is leased, watched, classified and committed like any other. More in docs/explore.md.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import time
from pathlib import Path
from typing import Any, Callable

from hazards.family import Family, StaticVerdict
from hazards.replay import mismatch_rate, params_json, repro_command
from hazards.engine.campaign import LeasedCampaign
from hazards.engine.errors import UserError
from hazards.engine.evidence import Evidence
from hazards.engine.loop import WorkItem
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.sources import MAX_CONSECUTIVE_ERRORS, Driven, DriverStopped
from hazards.engine.stats import format_rate, rate_ci

KIND = "explore"
ALPHA = 1e-3              # chance that a point failing at exactly its predicted rate looks like a GAP
DEFAULT_MAX_LAUNCHES = 20_000
DEFAULT_POINT_RUNS = 10
SEARCH_SHARE = 0.85       # of a time budget, for generating and shrinking; the rest re-measures
MAX_EXAMPLES_UNBOUNDED = 1_000_000
TARGET_LABEL = "failure rate per launch"


class Agreement(str, enum.Enum):
    """How one explored point's runs compare with the static model's call."""

    CLEAN = "clean as predicted"
    FAILED = "failed as predicted"
    MISSED = "model missed a hazard"
    GAP = "model gap or blind harness"
    RATE = "failed at a rate the model does not predict"
    TOO_RARE = "clean, rate too low for the launch cap"
    OBSERVED = "failed (rate not predicted)"
    UNCONFIRMED = "clean (rate not predicted)"
    REFUSED = "refused by the binary"
    ERROR = "error"
    CUT_SHORT = "cut short by the end of the budget"

    def __str__(self) -> str:
        return self.value

    @property
    def judged(self) -> bool:
        """Whether the point's runs say anything about the model."""
        return self not in (Agreement.ERROR, Agreement.REFUSED, Agreement.CUT_SHORT)

    @property
    def disagrees(self) -> bool:
        return self in (Agreement.MISSED, Agreement.GAP, Agreement.RATE)


class ModelMissed(AssertionError):
    """A point the model expects clean failed: a hazard it missed, or a surprise."""


class ModelGap(AssertionError):
    """A point the model expects to fail stayed clean over its launch budget."""


class ModelRate(AssertionError):
    """A point the model expects to fail failed at a rate whose interval excludes the prediction."""


def rate_excluded(failed_launches: int, launches: int, rate: float, conf: float) -> bool:
    """Whether the two-sided per-launch interval of failed_launches / launches excludes `rate`."""
    if launches <= 0:
        return False
    low, high = rate_ci(min(failed_launches, launches), launches, conf)
    return not low <= rate <= high


def launch_budget(rate: float, alpha: float = ALPHA) -> int:
    """Launches after which a point failing at `rate` per launch has failed with probability
    at least 1 - alpha: ceil(ln(alpha) / ln(1 - rate))."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a launch budget needs a rate in (0, 1], got {rate!r}")
    if rate >= 1.0:
        return 1
    return max(1, math.ceil(math.log(alpha) / math.log1p(-rate)))


def model_row(verdict: StaticVerdict) -> str:
    """The agreement table's row for a model call."""
    rate = verdict.expected_rate
    if not verdict.hazardous:
        return "safe"
    if rate is None:
        return "hazardous, not rated"
    return "hazardous, rate 0 here" if rate == 0.0 else "hazardous, rate > 0"


ROWS = ("safe", "hazardous, rate > 0", "hazardous, rate 0 here", "hazardous, not rated")


@dataclasses.dataclass
class Observation:
    """One explored point: the model's call, what its runs showed, how they compare."""

    index: int
    point: dict[str, Any]
    verdict: StaticVerdict
    budget: int                      # launches the model's call asks for
    evidence: Evidence = dataclasses.field(default_factory=Evidence)
    agreement: Agreement = Agreement.ERROR
    reason: str = ""                 # the last run's reason (a failure's, an error's)
    observed_rate: float = 0.0       # mean per-run failure share (a hang/fault counts 1)

    @property
    def failed(self) -> bool:
        return self.evidence.failures > 0

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "point": self.point, "model": {
                    "hazardous": self.verdict.hazardous, "rate": self.verdict.expected_rate,
                    "reason": self.verdict.reason, "row": model_row(self.verdict)},
                "launch_budget": self.budget, "agreement": self.agreement.name.lower(),
                "observed_rate": self.observed_rate, "reason": self.reason, **self.evidence.to_json()}


@dataclasses.dataclass
class Finding:
    """A minimal disagreeing point, re-measured."""

    family: str
    kind: Agreement
    observation: Observation
    remeasured: Evidence | None = None
    confirmed: bool = True
    conf: float = 0.95

    @property
    def point(self) -> dict[str, Any]:
        return self.observation.point

    @property
    def repro(self) -> str:
        return repro_command(self.family, self.point)

    def rate_lines(self) -> list[str]:
        """The re-measured rate per run and per launch, with intervals (or why there is none)."""
        ev = self.remeasured
        if ev is None or not ev.judged:
            return ["not re-measured (the budget ended first)"]
        return [f"re-measured: {ev.failures}/{ev.judged} runs failed: {format_rate(ev.failures, ev.judged, self.conf)}",
                f"             {ev.failed_launches}/{ev.launches} launches failed: "
                f"{format_rate(min(ev.failed_launches, ev.launches), ev.launches, self.conf)}"]

    def headline(self) -> str:
        o = self.observation
        rate = o.verdict.expected_rate
        said = "safe" if not o.verdict.hazardous else (
            f"hazardous, {rate:.3g} per launch here" if rate is not None else "hazardous")
        if self.kind is Agreement.MISSED:
            what = (f"MODEL MISSED A HAZARD (or a hardware/compiler surprise): the model says {said} "
                    f"({o.verdict.reason}) but the point failed: {o.reason}")
        elif self.kind is Agreement.RATE:
            ev = o.evidence
            what = (f"MODEL RATE DISAGREES: the model says {said} ({o.verdict.reason}) but "
                    f"{ev.failed_launches}/{ev.launches} launches failed: "
                    f"{format_rate(min(ev.failed_launches, ev.launches), ev.launches, self.conf)}")
        else:
            what = (f"MODEL GAP OR BLIND HARNESS: the model says {said} ({o.verdict.reason}) but "
                    f"{o.evidence.launches} launches ran clean (budget {o.budget})")
        if not self.confirmed:
            what += "; NOT CONFIRMED: the re-measured rate is consistent with the prediction"
        return what

    def to_json(self) -> dict[str, Any]:
        ev = self.remeasured
        d: dict[str, Any] = {"kind": self.kind.name.lower(), "confirmed": self.confirmed, "point": self.point,
                             "params_json": params_json(self.point), "repro": self.repro,
                             "observation": self.observation.to_json(), "headline": self.headline()}
        if ev is not None and ev.judged:
            d["remeasured"] = {**ev.to_json(self.conf),
                               "run_ci": list(rate_ci(ev.failures, ev.judged, self.conf)),
                               "launch_ci": list(rate_ci(min(ev.failed_launches, ev.launches), ev.launches, self.conf))}
        return d


@dataclasses.dataclass
class ExploreResult:
    """What one `explore_family` found."""

    family: str
    campaign_id: int | None
    database: str
    replay: bool
    targeted: bool
    observations: list[Observation] = dataclasses.field(default_factory=list)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    replayed: int = 0                 # examples the database held for this family at the start
    elapsed_s: float = 0.0
    stop_reason: str = ""
    error: str | None = None          # the driver's own failure (never a finding)

    @property
    def first_failure_example(self) -> int | None:
        """The example number (1-based) of the first point whose runs failed."""
        return next((o.index for o in self.observations if o.failed), None)

    @property
    def disagreements(self) -> list[Finding]:
        """Confirmed disagreements: what makes `hazards explore` exit 1."""
        return [f for f in self.findings if f.confirmed]

    @property
    def judged(self) -> int:
        return sum(1 for o in self.observations if o.agreement.judged)

    @property
    def exit_code(self) -> int:
        if self.disagreements:
            return 1
        if self.error or (self.observations and not self.judged):
            return 3
        return 0

    def table(self) -> dict[str, dict[str, int]]:
        """{model row: {agreement name: points}} over every judged point."""
        out: dict[str, dict[str, int]] = {row: {} for row in ROWS}
        for o in self.observations:
            if not o.agreement.judged:
                continue
            row = out[model_row(o.verdict)]
            row[o.agreement.name.lower()] = row.get(o.agreement.name.lower(), 0) + 1
        return out

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.observations:
            out[o.agreement.name.lower()] = out.get(o.agreement.name.lower(), 0) + 1
        return out

    def totals(self) -> dict[str, int]:
        runs = sum(o.evidence.n for o in self.observations)
        launches = sum(o.evidence.launches for o in self.observations)
        return {"examples": len(self.observations), "runs": runs, "launches": launches}

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "campaign": self.campaign_id, "database": self.database,
                "replay": self.replay, "targeted": self.targeted, "replayed_from_database": self.replayed,
                **self.totals(), "elapsed_s": self.elapsed_s, "first_failure_example": self.first_failure_example,
                "agreement": self.table(), "counts": self.counts(), "stop_reason": self.stop_reason,
                "error": self.error, "exit_code": self.exit_code,
                "findings": [f.to_json() for f in self.findings],
                "observations": [o.to_json() for o in self.observations]}

    def summary(self) -> dict[str, Any]:
        """What a soak keeps of it (its spec's `explored`): totals, the table, the verdict."""
        return {"family": self.family, "campaign": self.campaign_id, "exit_code": self.exit_code, **self.totals(),
                "elapsed_s": self.elapsed_s, "first_failure_example": self.first_failure_example,
                "agreement": self.table(), "counts": self.counts(), "error": self.error,
                "disagreements": [f"{f.headline()} at {params_json(f.point)}; replay: {f.repro}"
                                  for f in self.disagreements]}

    def lines(self) -> list[str]:
        """The human report: totals, the agreement table, the findings with repro lines."""
        t = self.totals()
        head = (f"explore {self.family}: {t['examples']} points, {t['runs']} runs, {t['launches']:,} launches "
                f"in {self.elapsed_s:.1f} s" + (" (replay of the database only)" if self.replay else ""))
        first = self.first_failure_example
        out = [head, f"example database: {self.database} ({self.replayed} known point(s) replayed first)",
               f"first failing point: example {first}" if first else "no point failed"]
        out.append(f"{'model says':26s} {'agrees':>8s} {'disagrees':>10s}   detail")
        for row, cells in self.table().items():
            agree = sum(n for k, n in cells.items() if not Agreement[k.upper()].disagrees)
            disagree = sum(n for k, n in cells.items() if Agreement[k.upper()].disagrees)
            detail = ", ".join(f"{Agreement[k.upper()]} {n}" for k, n in sorted(cells.items()))
            out.append(f"{row:26s} {agree:8d} {disagree:10d}   {detail or '-'}")
        c = self.counts()
        if c.get("refused") or c.get("error"):
            out.append(f"not judged: {c.get('refused', 0)} refused by the binary, {c.get('error', 0)} errors")
        for f in self.findings:
            out.append(f.headline())
            out.append(f"  point: {params_json(f.point)}")
            out += [f"  {line}" for line in f.rate_lines()]
            out.append(f"  replay: {f.repro}")
        if self.error:
            out.append(f"explore could not finish: {self.error}")
        if self.stop_reason:
            out.append(f"stopped: {self.stop_reason}")
        verdict = ("DISAGREES with the model" if self.disagreements else
                   "could not judge" if self.exit_code == 3 else "agrees with the model")
        out.append(f"explore {self.family}: {verdict}")
        return out


def database_key(family: Family) -> bytes:
    """The example-database key of a family's explore property (one per family, any store)."""
    return f"hazards-explore:{family.name}".encode()


def database_entries(database_dir: str | Path, family: Family) -> int:
    """Known failing points the database holds for a family's explore property: the
    minimal ones (hypothesis' primary key) and those met on the way (its secondary key)."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    db, key = DirectoryBasedExampleDatabase(str(database_dir)), database_key(family)
    return sum(1 for k in (key, key + b".secondary") for _ in db.fetch(k))


@dataclasses.dataclass
class ExploreOptions:
    """How to explore: the search size and the runs per point."""

    budget_s: float = math.inf
    examples: int | None = None
    replay: bool = False
    target: bool = True
    seed: int | None = None              # the same points again; a seeded search neither reads nor writes
                                         # the database (hypothesis.seed)
    launches: int | None = None          # per run (default: the family's)
    max_launches: int = DEFAULT_MAX_LAUNCHES
    point_runs: int = DEFAULT_POINT_RUNS
    timeout_s: float | None = None       # per run (default: the family's)
    alpha: float = ALPHA
    conf: float = 0.95
    stop_at_rate: float | None = None    # the targeting measurement: stop at the first point whose observed
                                         # failure rate (per launch, a hang 1) reaches this
    strategy: Any = None                 # a strategy of points (default: the family's)


ItemFor = Callable[[dict[str, Any]], WorkItem]


class _Explorer:
    """The driver: hypothesis' property over the family, asking the loop for runs."""

    def __init__(self, family: Family, item_for: ItemFor, opts: ExploreOptions, result: ExploreResult,
                 database: Any, search_deadline: float) -> None:
        self.family, self.item_for, self.opts, self.result = family, item_for, opts, result
        self.database, self.search_deadline = database, search_deadline
        self.last: dict[Agreement, Observation] = {}
        self.errors_in_a_row = 0

    # -- one point -------------------------------------------------------------------------
    def judge(self, point: dict[str, Any], ask: Callable[[WorkItem], RunResult]) -> Observation:
        """Run one point as the model's call asks and classify it."""
        index = len(self.result.observations) + 1
        try:
            verdict = self.family.static_model(dict(point))
        except UserError as e:  # the one resolver refused it: a strategy bug, not a run
            obs = Observation(index, point, StaticVerdict(False, "not resolvable"), 0,
                              agreement=Agreement.REFUSED, reason=str(e))
            self.result.observations.append(obs)
            return obs
        rate = verdict.expected_rate
        item = self.item_for(point)
        per_run = item.launches or 1
        expect_fail = rate is not None and rate > 0
        budget = min(self.opts.max_launches, max(per_run, launch_budget(rate, self.opts.alpha))) if expect_fail \
            else per_run
        obs = Observation(index, point, verdict, budget)
        self.result.observations.append(obs)
        rates: list[float] = []
        while True:
            try:
                r = ask(item)
            except DriverStopped:  # the budget ended before this point was judged
                if obs.evidence.n:
                    obs.agreement = Agreement.CUT_SHORT
                else:  # never ran: not a point of this search
                    self.result.observations.remove(obs)
                raise
            obs.evidence.add(r)
            if Outcome(r.outcome) is Outcome.ERROR:
                obs.agreement = Agreement.REFUSED if r.error_kind == "bad_request" else Agreement.ERROR
                obs.reason = r.reason
                self.errors_in_a_row = self.errors_in_a_row + 1 if obs.agreement is Agreement.ERROR else 0
                if self.errors_in_a_row >= MAX_CONSECUTIVE_ERRORS:  # the target cannot run: stop, say why
                    self.result.error = f"{self.errors_in_a_row} errors in a row, last: {r.reason}"
                    raise DriverStopped()
                return obs
            self.errors_in_a_row = 0
            rates.append(mismatch_rate(r) or 0.0)
            obs.observed_rate = sum(rates) / len(rates)
            if Outcome(r.outcome).is_failure:
                obs.reason = r.reason
                break
            if not expect_fail or obs.evidence.launches >= budget:
                break
        failed = obs.failed
        if rate is None:
            obs.agreement = Agreement.OBSERVED if failed else Agreement.UNCONFIRMED
        elif not expect_fail:
            obs.agreement = Agreement.MISSED if failed else Agreement.CLEAN
        elif failed:
            excluded = rate_excluded(obs.evidence.failed_launches, obs.evidence.launches, rate, self.opts.conf)
            obs.agreement = Agreement.RATE if excluded else Agreement.FAILED
        else:
            capped = launch_budget(rate, self.opts.alpha) > budget
            obs.agreement = Agreement.TOO_RARE if capped else Agreement.GAP
        return obs

    # -- the property ------------------------------------------------------------------------
    def property_test(self, ask: Callable[[WorkItem], RunResult]) -> Callable[[], None]:
        from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings, target
        from hypothesis import seed as hseed

        opts = self.opts
        phases = [Phase.explicit, Phase.reuse] if opts.replay else \
            [Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink] + ([Phase.target] if opts.target else [])
        strategy = opts.strategy if opts.strategy is not None else self.family.strategy()

        def bounded_ask(item: WorkItem) -> RunResult:
            if time.monotonic() >= self.search_deadline:
                raise DriverStopped()
            return ask(item)

        @settings(database=self.database, max_examples=opts.examples or MAX_EXAMPLES_UNBOUNDED, deadline=None,
                  phases=phases, report_multiple_bugs=True, verbosity=Verbosity.quiet, print_blob=False,
                  derandomize=False, suppress_health_check=list(HealthCheck))
        @given(point=strategy)
        def explore_point(point: dict[str, Any]) -> None:
            obs = self.judge(dict(point), bounded_ask)
            if obs.agreement in (Agreement.ERROR, Agreement.REFUSED):
                reject()
            if opts.target:
                target(obs.observed_rate, label=TARGET_LABEL)
            if opts.stop_at_rate is not None and obs.failed and obs.observed_rate >= opts.stop_at_rate:
                self.result.stop_reason = f"example {obs.index} failed at rate {obs.observed_rate:.3g}"
                raise DriverStopped()
            if obs.agreement is Agreement.MISSED:
                self.last[Agreement.MISSED] = obs
                raise ModelMissed(obs.reason)
            if obs.agreement is Agreement.GAP:
                self.last[Agreement.GAP] = obs
                raise ModelGap(f"{obs.evidence.launches} clean launches")
            if obs.agreement is Agreement.RATE:
                self.last[Agreement.RATE] = obs
                raise ModelRate(f"{obs.evidence.failed_launches}/{obs.evidence.launches} launches failed")

        explore_point._hypothesis_internal_database_key = database_key(self.family)  # type: ignore[attr-defined]
        if opts.seed is not None:
            explore_point = hseed(opts.seed)(explore_point)
        return explore_point

    def search(self, ask: Callable[[WorkItem], RunResult]) -> None:
        """Run hypothesis; its failures are our findings (recorded as they were raised)."""
        import unittest

        if self.opts.replay and not self.result.replayed:
            self.result.stop_reason = "nothing to replay: the database holds no point for this family"
            return
        test = self.property_test(ask)
        try:
            test()
        except DriverStopped:
            raise
        except unittest.SkipTest:  # replay with nothing in the database
            self.result.stop_reason = "nothing to replay: the database holds no point for this family"
        except Exception as e:  # ModelMissed / ModelGap / their ExceptionGroup / Flaky: recorded already
            if not self.last:
                raise RuntimeError(f"hypothesis stopped: {type(e).__name__}: {e}") from e

    def remeasure(self, ask: Callable[[WorkItem], RunResult]) -> None:
        """Re-run every minimal disagreeing point `point_runs` times (budget permitting)."""
        for kind in (Agreement.MISSED, Agreement.GAP, Agreement.RATE):
            obs = self.last.get(kind)
            if obs is None:
                continue
            finding = Finding(self.family.name, kind, obs, conf=self.opts.conf)
            self.result.findings.append(finding)
            ev = Evidence()
            item = self.item_for(obs.point)
            try:
                for _ in range(self.opts.point_runs):
                    ev.add(ask(item))
            except DriverStopped:
                pass
            finding.remeasured = ev
            rate = obs.verdict.expected_rate
            if kind is Agreement.GAP and rate and ev.launches:
                # a GAP stands only if the point's rate is shown below the prediction
                finding.confirmed = ev.launch_upper(self.opts.conf) < rate
            if kind is Agreement.RATE:
                # the search stopped at a failure (its rate leans high): only a fixed number of
                # re-runs whose interval still excludes the prediction confirms it
                finding.confirmed = bool(rate) and rate_excluded(ev.failed_launches, ev.launches, rate,
                                                                 self.opts.conf)

    def drive(self, ask: Callable[[WorkItem], RunResult]) -> None:
        try:
            self.search(ask)
        except DriverStopped:
            if not self.result.stop_reason:
                self.result.stop_reason = "the target could not run" if self.result.error else "the budget ended"
        self.remeasure(ask)


# Targets that are not catalog families but have a configuration space to explore: the module
# defines SPACE (a Family: parameters, variants, static model, strategy) and item_for(point).
TARGET_SPACES = {"ragged_decode": "hazards.ragged_decode.space"}


def explorable(name: str) -> tuple[Family, ItemFor | None]:
    """What `hazards explore NAME` explores: a catalog family with a launch server (items:
    None, the family's server), or a target's configuration space with its items."""
    import importlib

    from hazards.families import all_families

    if name in TARGET_SPACES:
        mod = importlib.import_module(TARGET_SPACES[name])
        return mod.SPACE, mod.item_for
    runtime = {f.name: f for f in all_families() if f.binary}
    if name not in runtime:
        static = sorted(f.name for f in all_families() if not f.binary)
        known = ", ".join(sorted(runtime) + sorted(TARGET_SPACES))
        why = " (a static family: no runtime binary)" if name in static else ""
        raise UserError(f"nothing to explore called {name!r}{why}; known: {known}")
    return runtime[name], None


def default_item_for(family: Family, *, launches: int | None = None, timeout_s: float | None = None) -> ItemFor:
    """Points as requests to the family's warm launch server (built or taken from the build
    cache by `hazards.stress_family.family_item`), labelled `explore:<variant>` in the store."""
    from hazards.stress_family import family_item

    server = family_item(family, launches=launches, timeout=timeout_s)

    def item_for(point: dict[str, Any]) -> WorkItem:
        variant = str(point.get("variant", family.variants[0].name))
        return dataclasses.replace(server, variant=f"explore:{variant}", params=dict(point), expect=None)

    return item_for


def _first_point(family: Family) -> dict[str, Any]:
    return {"variant": family.variants[0].name}


def explore_family(frame: LeasedCampaign, family: Family, opts: ExploreOptions, *, database_dir: str | Path,
                   item_for: ItemFor | None = None, campaign_name: str | None = None,
                   on_result: Callable[[int, WorkItem, RunResult], None] | None = None) -> ExploreResult:
    """Explore one family in `frame` (one campaign of kind 'explore'); see docs/explore.md, In the code."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    if not family.binary and item_for is None:
        raise UserError(f"family {family.name!r} has no runtime binary: nothing to explore on a GPU")
    if opts.examples is not None and opts.examples < 1:
        raise UserError(f"--examples must be at least 1, got {opts.examples}")
    if opts.point_runs < 0 or opts.max_launches < 1:
        raise UserError("--point-runs must be >= 0 and --max-launches >= 1")
    if not (opts.budget_s > 0):
        raise UserError(f"the budget must be positive, got {opts.budget_s!r}")
    if opts.launches is not None and opts.launches < 1:
        raise UserError(f"--launches must be at least 1, got {opts.launches}")
    database_dir = Path(database_dir)
    database_dir.mkdir(parents=True, exist_ok=True)
    if item_for is None:
        item_for = default_item_for(family, launches=opts.launches, timeout_s=opts.timeout_s)
    elif opts.launches or opts.timeout_s:
        given = item_for

        def item_for(point: dict[str, Any]) -> WorkItem:  # the run options laid over the caller's items
            item = given(point)
            return dataclasses.replace(item, launches=opts.launches or item.launches,
                                       timeout_s=opts.timeout_s or item.timeout_s)
    result = ExploreResult(family.name, None, str(database_dir), opts.replay, opts.target,
                           replayed=database_entries(database_dir, family))
    t0 = time.monotonic()
    deadline = t0 + opts.budget_s
    search_deadline = t0 + opts.budget_s * SEARCH_SHARE if math.isfinite(opts.budget_s) else math.inf
    explorer = _Explorer(family, item_for, opts, result,
                         DirectoryBasedExampleDatabase(str(database_dir)), search_deadline)
    spec = {"family": family.name, "budget_s": opts.budget_s if math.isfinite(opts.budget_s) else None,
            "examples": opts.examples, "replay": opts.replay, "target": opts.target, "seed": opts.seed,
            "launches": item_for(_first_point(family)).launches, "max_launches": opts.max_launches,
            "alpha": opts.alpha, "database": str(database_dir)}
    result.campaign_id = frame.create(KIND, spec, name=campaign_name or f"explore {family.name}")
    source = Driven(explorer.drive, deadline=deadline)
    try:
        frame.run(result.campaign_id, source, budget_s=opts.budget_s, on_result=on_result)
    finally:
        source.close()
        result.elapsed_s = time.monotonic() - t0
    if source.error is not None:
        result.error = f"{type(source.error).__name__}: {source.error}"
    stored = dict(frame.store.campaign(result.campaign_id).spec)
    stored["result"] = {k: v for k, v in result.to_json().items() if k != "observations"}
    frame.store.update_campaign_spec(result.campaign_id, stored)
    return result


def explore_share(families: list[Family], database_dir: str | Path, *,
                  log: Callable[[str], None] = lambda s: None) -> Callable[[LeasedCampaign, float], list[dict[str, Any]]]:
    """The explorer of a soak's explore share (`hazards soak --explore`): every runtime family
    explored for an equal part of the seconds it is given, in the soak's frame; one summary
    per family (a family that cannot be built or explored says why in `error`)."""
    runtime = [f for f in families if f.binary]

    def run(frame: LeasedCampaign, seconds: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        t_end = time.monotonic() + seconds
        for k, fam in enumerate(runtime):
            share = (t_end - time.monotonic()) / (len(runtime) - k)
            if share <= 0.5:
                out.append({"family": fam.name, "error": "the explore share ended first", "exit_code": 3})
                continue
            try:
                res = explore_family(frame, fam, ExploreOptions(budget_s=share), database_dir=database_dir,
                                     campaign_name=f"soak explore {fam.name}")
            except UserError as e:
                out.append({"family": fam.name, "error": str(e), "exit_code": 3})
                continue
            out.append(res.summary())
            log(f"explore {fam.name}: {res.lines()[-1].split(': ', 1)[-1]} ({len(res.observations)} points)")
        return out

    return run
