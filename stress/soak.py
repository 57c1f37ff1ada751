"""Soak campaigns: every work item on every leased GPU for a time budget, then a comparison.

A soak is one campaign of kind 'soak'. Its spec holds the work items (so `--resume ID`
runs exactly the same set), the budget, the leases and one entry per session; the time
already spent is recomputed from the stored runs, so a soak whose supervisor was
SIGKILLed resumes with the budget it had left. At the end the GPU telemetry summary is
written into the spec and every item is judged against the store's history
(`soak_judgements`): a clean item that failed with a failure signature no earlier campaign
had, or whose failure rate rose significantly since the previous soak, `regressed`; one
that failed as before is a `known hazard`; a canary that went blind or whose detection rate
dropped significantly fails; an item never judged is an error. Rate changes are one-sided
exact tests (Boschloo; Fisher for large samples) corrected with Holm across the items.
More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Callable

from .campaign import LeasedCampaign, RunObserver
from .errors import EXIT_DEGRADED, EXIT_HAZARD, EXIT_OK, UserError, check_seconds
from .evidence import Evidence, evidence_of
from .loop import GpuStats, TargetFactory, WorkItem
from .outcome import RunResult, item_key
from .sources import EvidenceAllocation, Rotation, canary_sprt
from .stats import boschloo, fisher_one_sided, holm
from .store import Signature, Store
from .verdict import Expect, ItemTally, Judgement, Proof, Verdict, campaign_tallies, judge
from .verdict import exit_code as verdicts_exit_code

KIND = "soak"
ALLOCATIONS = ("evidence", "uniform")
BOSCHLOO_MAX_N = 200  # scipy's boschloo_exact takes ~0.1 s at n=100 and seconds beyond 1000

_TARGET_KEYS = {"name": str, "kind": str, "argv": list, "cwd": str, "env": dict, "timeout": (int, float),
                "params": dict, "launches": int, "respawn_every": int, "result_regex": str, "variant": str,
                "expect": str, "handshake_timeout": (int, float)}
_SERVER_ONLY = ("launches", "respawn_every", "handshake_timeout")


def load_targets(path: str | os.PathLike[str]) -> list[WorkItem]:
    """Registered targets from a TOML file: one `[[target]]` table per target.

    Keys: name (required), argv (required, list of strings), kind ('command' default, or
    'server'), cwd (relative to the file's folder), env (table of strings), timeout
    (seconds, default 60), params (table), launches (server), respawn_every (server),
    handshake_timeout (server: seconds a new worker may take to send its handshake, default
    60), result_regex (command), variant (a label), expect ('clean', the default: any failure
    is a hazard; or 'detect': a canary that must fail). Anything else, and a program that
    cannot be started (not found, not executable, an interpreter its #! line names that
    is missing), is a UserError: nothing is run or stored.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"targets file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read targets file {p}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"targets file {p} is not valid TOML: {e}") from None
    tables = data.get("target", [])
    extra = set(data) - {"target"}
    if extra or not isinstance(tables, list) or not tables:
        raise UserError(f"targets file {p}: expected one or more [[target]] tables"
                        + (f" (unknown top-level keys: {', '.join(sorted(extra))})" if extra else ""))
    items, seen = [], set()
    for i, t in enumerate(tables, 1):
        items.append(_target_item(p, i, t))
        if items[-1].key in seen:
            raise UserError(f"targets file {p}: target {items[-1].key!r} is defined twice")
        seen.add(items[-1].key)
    return items


def _non_finite(value: Any, where: str) -> str | None:
    """Where in a TOML value a non-finite number is ("params.a.b[1] is inf"), or None:
    such a number has no JSON spelling, so the program would get invalid `HZ_PARAMS`."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value!r}"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}[{key}]" if isinstance(value, list) else f"{where}.{key}")
        if found:
            return found
    return None


def _target_item(path: Path, index: int, t: Any) -> WorkItem:
    from .targets.base import check_argv, check_cwd, check_env

    where = f"targets file {path}, target #{index}"
    if not isinstance(t, dict):
        raise UserError(f"{where}: not a table")
    for k, v in t.items():
        if k not in _TARGET_KEYS:
            raise UserError(f"{where}: unknown key {k!r} (known: {', '.join(sorted(_TARGET_KEYS))})")
        if not isinstance(v, _TARGET_KEYS[k]) or isinstance(v, bool):
            raise UserError(f"{where}: {k!r} has the wrong type ({type(v).__name__})")
    name, argv = t.get("name", ""), t.get("argv", [])
    if not name.strip():
        raise UserError(f"{where}: 'name' is required")
    where = f"{where} ({name})"
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise UserError(f"{where}: 'argv' must be a non-empty list of strings")
    kind = t.get("kind", "command")
    if kind not in ("command", "server"):
        raise UserError(f"{where}: kind must be 'command' or 'server', not {kind!r}")
    wrong = [k for k in (_SERVER_ONLY if kind == "command" else ("result_regex",)) if k in t]
    if wrong:
        raise UserError(f"{where}: {wrong[0]!r} does not apply to a {kind} target")
    timeout = check_seconds(t.get("timeout", 60), f"{where}: timeout")
    handshake = check_seconds(t.get("handshake_timeout"), f"{where}: handshake_timeout")
    if t.get("launches", 1) < 1 or t.get("respawn_every", 0) < 0:
        raise UserError(f"{where}: launches must be at least 1 and respawn_every at least 0")
    if not all(isinstance(v, str) for v in t.get("env", {}).values()):
        raise UserError(f"{where}: env values must be strings")
    bad_number = _non_finite(t.get("params", {}), "params")
    if bad_number:
        raise UserError(f"{where}: {bad_number}: parameters must be finite numbers (they are passed as JSON)")
    expect = t.get("expect", "clean")
    if expect not in ("clean", "detect"):
        raise UserError(f"{where}: expect must be 'clean' or 'detect', not {expect!r}")
    if "result_regex" in t:
        try:
            re.compile(t["result_regex"])
        except re.error as e:
            raise UserError(f"{where}: result_regex is not a valid regular expression: {e}") from None
    cwd = t.get("cwd")
    cwd = str((path.parent / cwd).resolve()) if cwd else None
    try:  # the program must start, as it will in the soak: found, executable, its interpreter there
        check_argv(list(argv), check_cwd(cwd), check_env(dict(t.get("env", {}))))
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    return WorkItem(target=name, variant=t.get("variant", ""), expect=expect, kind=kind, argv=tuple(argv),
                    env=dict(t.get("env", {})), cwd=cwd, params=dict(t.get("params", {})),
                    launches=t.get("launches"), timeout_s=timeout, respawn_every=int(t.get("respawn_every", 0)),
                    result_regex=t.get("result_regex"), handshake_timeout_s=handshake)


# -- the campaign against the history of the store -------------------------------------------

def item_expectations(spec: dict[str, Any]) -> dict[str, tuple[Expect | None, Proof]]:
    """{target/variant: (expectation, proof)} of a campaign's work items (from its spec)."""
    items = [WorkItem.from_json(i) for i in spec.get("items", []) if isinstance(i, dict)]
    return {i.key: (i.expectation, i.proof) for i in items}


@dataclasses.dataclass
class RateChange:
    """A target/variant whose rate changed significantly between two campaigns: the failure
    rate, or for a canary (expect detect) the detection rate (failures its proof accepts).
    `p` is the one-sided test's, `p_adjusted` Holm's over the comparison's tests of the same
    kind; `regression` is True for a clean item's rise and a canary's drop."""

    target: str
    variant: str
    k_before: int
    n_before: int
    k_after: int
    n_after: int
    direction: str  # "rose" | "dropped"
    p: float
    test: str
    verdict: str
    expect: str | None = None
    p_adjusted: float = 1.0
    regression: bool = False

    @property
    def key(self) -> str:
        return item_key(self.target, self.variant)


@dataclasses.dataclass
class CampaignComparison:
    """What a campaign shows against the store's history: failure signatures no earlier
    campaign had, and significant rate changes against the previous campaign of its kind
    (`previous_id`; None when there is none, and then no rate changes)."""

    current_id: int
    previous_id: int | None
    new_signatures: list[Signature]
    changes: list[RateChange]

    @property
    def regressions(self) -> list[RateChange]:
        return [c for c in self.changes if c.regression]


def previous_campaign(store: Store, campaign_id: int) -> int | None:
    """The latest earlier campaign of the same kind that stored runs, if any."""
    kind = store.campaign(campaign_id).kind
    earlier = [c.id for c in store.campaigns(kind) if c.id < campaign_id and store.run_count(c.id)]
    return earlier[-1] if earlier else None


def _one_sided(k1: int, n1: int, k2: int, n2: int) -> tuple[float, str]:
    """p for "rate 1 > rate 2": Boschloo when cheap, Fisher otherwise."""
    if max(n1, n2) <= BOSCHLOO_MAX_N:
        return boschloo(k1, n1, k2, n2), "Boschloo"
    return fisher_one_sided(k1, n1, k2, n2), "Fisher"


def _rate_counts(tally: ItemTally, expect: Expect | None) -> tuple[int, int]:
    """(events, judged runs): detections of a canary, failures of anything else."""
    return (tally.proved if expect is Expect.DETECT else tally.failures), tally.judged


def compare_campaigns(store: Store, current_id: int, previous_id: int | None = None, *,
                      alpha: float = 0.05) -> CampaignComparison:
    """A campaign against the store's history.

    New signatures: those of its runs that no earlier campaign's run had ("never seen
    before", not "absent from the last campaign": a rare hazard that missed one night is
    not new the next). Rate changes against the previous campaign of its kind, per
    target/variant, one-sided both ways (Boschloo, Fisher beyond BOSCHLOO_MAX_N runs). The
    regression direction (a clean item's failure rate rising, a canary's detection rate
    dropping) is one family of tests and the other direction another; each is corrected
    with Holm so that, across all target/variants, the chance of flagging any change that
    is not there stays below `alpha`. A canary detected more often is not a regression."""
    if previous_id is None:
        previous_id = previous_campaign(store, current_id)
    new = store.new_signatures(current_id)
    if previous_id is None:
        return CampaignComparison(current_id, None, new, [])
    tallies, expected, names = {}, {}, {}
    for cid in (previous_id, current_id):
        exp = item_expectations(store.campaign(cid).spec)
        tallies[cid] = campaign_tallies(store, cid, {k: proof for k, (_, proof) in exp.items()})
        expected.update({k: e for k, (e, _) in exp.items()})
    for sr in store.iter_runs(current_id):
        names.setdefault(sr.result.key, (sr.result.target, sr.result.variant))
    tests = []  # (key, direction, p, test, counts, regression)
    for key, after in tallies[current_id].items():
        before = tallies[previous_id].get(key)
        if before is None or not before.judged or not after.judged:
            continue
        expect = expected.get(key, Expect.CLEAN)
        (kb, nb), (ka, na) = _rate_counts(before, expect), _rate_counts(after, expect)
        p_rose, test = _one_sided(ka, na, kb, nb)
        p_drop, _ = _one_sided(kb, nb, ka, na)
        worse = "dropped" if expect is Expect.DETECT else "rose"
        for direction, p in (("rose", p_rose), ("dropped", p_drop)):
            tests.append((key, direction, p, test, (kb, nb, ka, na), direction == worse and expect is not None))
    changes = []
    for family in (True, False):  # regressions, then the other changes: Holm within each
        members = [t for t in tests if t[5] is family]
        for (key, direction, p, test, (kb, nb, ka, na), regression), adj in zip(
                members, holm([t[2] for t in members])):
            if adj >= alpha:
                continue
            expect = expected.get(key, Expect.CLEAN)
            what = "detection rate" if expect is Expect.DETECT else "failure rate"
            changes.append(RateChange(
                *names[key], kb, nb, ka, na, direction, p, test,
                f"{what} {direction} from {kb}/{nb} to {ka}/{na} (one-sided {test} p={p:.2g}, "
                f"Holm-adjusted over {len(members)} target/variants p={adj:.2g})",
                expect=expect.value if expect else None, p_adjusted=adj, regression=regression))
    return CampaignComparison(current_id, previous_id, new, changes)


def against_history(expect: Expect | None, judgement: Judgement, new: list[Signature],
                    change: RateChange | None) -> Judgement:
    """A soak item's verdict, given its plain judgement, its never-seen-before signatures
    and its regression (if any). A clean item that failed is `regressed` when a failure is
    new to the store or its rate rose significantly, else a `known hazard` (not flagged: the
    report shows its rate and trend); a canary whose detection rate dropped is `regressed`."""
    if expect is Expect.CLEAN and judgement.verdict is Verdict.FAILED:
        why = []
        if new:
            shown = "; ".join(f"{s.outcome}: {s.message}" for s in new[:3])
            why.append(f"{len(new)} failure signature(s) never seen before in the store ({shown})")
        if change is not None:
            why.append(change.verdict)
        if why:
            return Judgement(Verdict.REGRESSED, f"{judgement.message}; " + "; ".join(why))
        return Judgement(Verdict.KNOWN, f"{judgement.message}; every failure signature was seen in an earlier "
                                        "campaign and the rate did not rise significantly")
    if expect is Expect.DETECT and judgement.verdict is Verdict.DETECTED and change is not None:
        return Judgement(Verdict.REGRESSED, f"{judgement.message}; {change.verdict}")
    return judgement


def soak_judgements(store: Store, campaign_id: int, comparison: CampaignComparison | None = None
                    ) -> dict[str, tuple[Expect | None, Judgement]]:
    """{target/variant: (expectation, verdict)} of a soak campaign: every item of its spec
    (never run: an error) and anything else it ran (expected clean), judged on its runs,
    the items dropped after repeated errors, and the store's history. The soak's exit code,
    its lines, its report and its JUnit file all come from this."""
    camp = store.campaign(campaign_id)
    expected = item_expectations(camp.spec)
    tallies = campaign_tallies(store, campaign_id, {k: proof for k, (_, proof) in expected.items()})
    dropped = camp.spec.get("dropped") or {}
    cmp = comparison if comparison is not None else compare_campaigns(store, campaign_id)
    new: dict[str, list[Signature]] = {}
    for sig in cmp.new_signatures:
        new.setdefault(item_key(sig.target, sig.variant), []).append(sig)
    worse = {c.key: c for c in cmp.regressions}
    out = {}
    for key in sorted(set(expected) | set(tallies)):
        expect = expected[key][0] if key in expected else Expect.CLEAN
        base = judge(expect, tallies.get(key, ItemTally()), dropped=dropped.get(key))
        out[key] = (expect, against_history(expect, base, new.get(key, []), worse.get(key)))
    return out


# -- the soak itself --------------------------------------------------------------------------

@dataclasses.dataclass
class SoakResult:
    """How a soak session ended, and its verdicts (`soak_judgements`)."""

    campaign_id: int
    status: str
    gpu_stats: list[GpuStats]
    spent_s: float
    budget_s: float
    comparison: CampaignComparison
    dropped: dict[str, str]
    expectations: dict[str, Expect | None]
    judgements: dict[str, Judgement]
    lost: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # nodes an executor lost (Ray)
    allocation: str = "evidence"
    evidence: dict[str, Evidence] = dataclasses.field(default_factory=dict)
    explored: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the explorer's summaries

    @property
    def runs(self) -> int:
        return sum(e.n for e in self.evidence.values())

    @property
    def canary_reruns(self) -> int:
        """Runs spent on canaries after their first detection."""
        return sum(e.runs_after_detection for k, e in self.evidence.items()
                   if self.expectations.get(k) is Expect.DETECT)

    def worst_clean(self, conf: float = 0.95) -> tuple[str, Evidence] | None:
        """The clean item (expect clean) whose per-launch upper bound is weakest, failed ones
        excluded (their rate is news, not a bound); None without one."""
        clean = [(k, e) for k, e in self.evidence.items()
                 if self.expectations.get(k) is Expect.CLEAN and not e.failures]
        return max(clean, key=lambda ke: ke[1].launch_upper(conf)) if clean else None

    def evidence_lines(self, conf: float = 0.95) -> list[str]:
        """Per item: role, runs, launches, the rate per run and per launch (intervals/bounds)."""
        out = [f"evidence ({self.allocation} allocation): {self.runs} runs, {self.canary_reruns} on canaries after "
               f"their first detection"]
        for k in sorted(self.evidence):
            e, expect = self.evidence[k], self.expectations.get(k)
            role = expect.noun if expect else "counted"
            extra = f"; {e.runs_after_detection} runs after detection" if expect is Expect.DETECT else ""
            out.append(f"  {k} [{role}] {e.judged} runs: {e.run_rate_text(conf)} per run; {e.launches:,} launches: "
                       f"{e.launch_rate_text(conf)} per launch{extra}")
        worst = self.worst_clean(conf)
        if worst:
            out.append(f"weakest clean bound: {worst[0]}, {worst[1].launch_upper(conf):.3g} per launch")
        return out

    def evidence_json(self, conf: float = 0.95) -> dict[str, Any]:
        worst = self.worst_clean(conf)
        return {"allocation": self.allocation, "runs": self.runs, "canary_reruns": self.canary_reruns,
                "canary_rerun_share": self.canary_reruns / self.runs if self.runs else 0.0,
                "worst_clean": {"item": worst[0], "launch_upper": worst[1].launch_upper(conf)} if worst else None,
                "items": {k: {"expect": str(self.expectations.get(k) or ""), **e.to_json(conf)}
                          for k, e in self.evidence.items()}}

    @property
    def explore_disagreements(self) -> list[str]:
        """One line per confirmed disagreement the explore share found."""
        return [f"{x['family']}: {h}" for x in self.explored for h in x.get("disagreements", [])]

    @property
    def blind(self) -> list[str]:
        """Canaries that were not detected: went blind, or never judged (the budget ended
        before they ran, or only errors), which must be flagged too, never pass unseen."""
        return [k for k, e in self.expectations.items() if e is Expect.DETECT and not self.judgements[k].ok]

    @property
    def problems(self) -> list[str]:
        """Every item whose verdict makes the soak exit non-zero."""
        return [k for k, j in self.judgements.items() if not j.ok]

    def canary_lines(self) -> list[str]:
        """One verdict line per item that makes the soak exit non-zero (canaries first)."""
        keys = sorted(self.problems, key=lambda k: (self.expectations.get(k) is not Expect.DETECT, k))
        return [self.judgements[k].line(k, self.expectations.get(k)) for k in keys]

    @property
    def exit_code(self) -> int:
        """1 a regression, a canary that went blind, or a confirmed disagreement with a static
        model found by the explore share; 3 items never judged; else 5 when the infrastructure
        degraded (a node lost: `degraded`); 0 otherwise."""
        code = verdicts_exit_code(j.verdict for j in self.judgements.values())
        if self.explore_disagreements:
            return EXIT_HAZARD
        return code or (EXIT_DEGRADED if self.degraded else EXIT_OK)

    @property
    def degraded(self) -> bool:
        """The infrastructure degraded mid-soak: a node (its GPUs) was lost; what ran on the
        others is stored and judged, and the lost capacity is in the campaign's spec."""
        return bool(self.lost)

    @property
    def flagged(self) -> bool:
        """Whether anything makes the soak exit non-zero."""
        return self.exit_code != 0


def spent_seconds(store: Store, campaign_id: int) -> float:
    """Budget already used by a campaign's sessions, from its stored runs.

    Each session starts at `spec["sessions"][i]["started"]` and lasted until the end of its
    last stored run (a killed session counts up to its last committed run).
    """
    starts = sorted(s["started"] for s in store.campaign(campaign_id).spec.get("sessions", []))
    if not starts:
        return 0.0
    ends = [0.0] * len(starts)
    for sr in store.iter_runs(campaign_id):
        end = (sr.result.started_at or 0.0) + (sr.result.duration_s or 0.0)
        i = max((j for j, s in enumerate(starts) if s <= (sr.result.started_at or 0.0)), default=None)
        if i is not None:
            ends[i] = max(ends[i], end)
    return sum(max(0.0, e - s) for s, e in zip(starts, ends))


def stored_time(store: Store, campaign_id: int) -> dict[str, tuple[int, float]]:
    """{item key: (runs, seconds of run time)} already stored for a campaign."""
    out: dict[str, tuple[int, float]] = {}
    for sr in store.iter_runs(campaign_id):
        r = sr.result
        key = r.key
        n, s = out.get(key, (0, 0.0))
        out[key] = (n + 1, s + max(0.0, r.duration_s or 0.0))
    return out


def start_or_resume(frame: LeasedCampaign, items: list[WorkItem] | None, *, budget_s: float, resume: int | None,
                    spec_extra: dict[str, Any] | None = None, name: str | None = None) -> tuple[int, list[WorkItem], float]:
    """Create the soak campaign in `frame` (or reopen `resume`); returns (id, items, budget left)."""
    if resume is None:
        if not items:
            raise UserError("nothing to soak: no families with a launch server and no --targets")
        spec = {"budget_s": budget_s, "items": [i.to_json() for i in items], **(spec_extra or {})}
        return frame.create(KIND, spec, name=name), items, budget_s
    _, stored, left = stored_soak(frame.store, resume)
    frame.reopen(resume, KIND)
    return resume, stored, left


def stored_soak(store: Store, resume: int) -> tuple[Any, list[WorkItem], float]:
    """(the campaign, its work items, the budget it has left) of the stored soak `resume`;
    UserError (one line) when it is not there, not a soak, or has no work items."""
    camp = store.campaign(resume)
    if camp.kind != KIND:
        raise UserError(f"campaign {resume} is a {camp.kind!r} campaign, not a soak")
    stored = [WorkItem.from_json(d) for d in camp.spec.get("items", [])]
    if not stored:
        raise UserError(f"campaign {resume} has no work items to resume")
    return camp, stored, max(0.0, float(camp.spec.get("budget_s", 0.0)) - spent_seconds(store, resume))


Explorer = Callable[[LeasedCampaign, float], list[dict[str, Any]]]  # (frame, seconds) -> summaries


def soak_source(items: list[WorkItem], allocation: str, store: Store, campaign_id: int) -> Any:
    """The work source of a soak: `EvidenceAllocation` or `Rotation`, seeded with the runs a
    resumed campaign already stored."""
    if allocation == "uniform":
        return Rotation(items, stored_time(store, campaign_id))
    if allocation != "evidence":
        raise UserError(f"--allocation must be one of {', '.join(ALLOCATIONS)}, got {allocation!r}")
    return EvidenceAllocation(items, sprt_for=canary_sprt, prior=(sr.result for sr in store.iter_runs(campaign_id)))


def run_soak(frame: LeasedCampaign, items: list[WorkItem] | None, *, budget_s: float,
             resume: int | None = None, name: str | None = None, spec_extra: dict[str, Any] | None = None,
             on_result: Callable[[int, WorkItem, RunResult], None] | None = None,
             target_factory: TargetFactory | None = None, observer: RunObserver | None = None,
             allocation: str = "evidence", explore_share: float = 0.0,
             explorer: Explorer | None = None) -> SoakResult:
    """Run (or resume) one soak campaign on the frame's leases and compare it with the previous
    soak; `observer` (a progress display) watches the loop.

    `allocation` picks the work source (docs/campaigns.md, In the code); `explore_share` of the budget
    goes to `explorer(frame, seconds)` after the items (not again on a resume that already
    explored). A resumed soak keeps the allocation and share it was started with."""
    if not 0.0 <= explore_share < 1.0:
        raise UserError(f"--explore must be a share of the budget in [0, 1), got {explore_share!r}")
    if allocation not in ALLOCATIONS:
        raise UserError(f"--allocation must be one of {', '.join(ALLOCATIONS)}, got {allocation!r}")
    store = frame.store
    extra = {**(spec_extra or {}), "allocation": allocation, "explore_share": explore_share if explorer else 0.0}
    cid, items, left = start_or_resume(frame, items, budget_s=budget_s, resume=resume, spec_extra=extra, name=name)
    spec = store.campaign(cid).spec
    allocation = spec.get("allocation", "uniform")  # a soak stored before allocations was uniform
    share = float(spec.get("explore_share", 0.0)) if explorer else 0.0
    explore_s = float(spec["budget_s"]) * share if "explored" not in spec else 0.0
    source = soak_source(items, allocation, store, cid)
    stats = frame.run(cid, source, budget_s=max(0.0, left - explore_s), target_factory=target_factory,
                      on_result=on_result, observer=observer)
    explored = list(spec.get("explored", []))
    if explorer is not None and explore_s > 0:
        explored = explorer(frame, explore_s)
        stored = dict(store.campaign(cid).spec)
        stored["explored"] = explored
        store.update_campaign_spec(cid, stored)
    camp = store.campaign(cid)
    comparison = compare_campaigns(store, cid)
    verdicts = soak_judgements(store, cid, comparison)
    evidence = evidence_of((sr.result for sr in store.iter_runs(cid)), {i.key: i.proof for i in items})
    return SoakResult(cid, camp.status, stats, spent_seconds(store, cid), float(camp.spec["budget_s"]),
                      comparison, dict(camp.spec.get("dropped") or {}), {k: e for k, (e, _) in verdicts.items()},
                      {k: j for k, (_, j) in verdicts.items()}, allocation=allocation,
                      evidence={i.key: evidence.get(i.key, Evidence()) for i in items}, explored=explored)
