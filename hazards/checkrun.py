"""The pre-merge check: static checks, then every canary and clean variant on every leased GPU.

Exit 0 only when the static checks pass, every canary (broken variant detected by
stress) was detected (a failure its oracle proved), no clean variant (reference/fixed)
failed, and nothing was left unjudged. A canary that was not "went blind": the check can
no longer see the hazard it exists for, which is a failure of the check, never good news.
The GPU part runs in one leased-campaign frame (`hazards.engine.campaign`) over every
free GPU; verdicts are `hazards.engine.verdict`'s. More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from hazards.family import Family, Variant
from hazards.stress_family import preset_expectation, variant_item
from hazards.engine.errors import EXIT_HAZARD, EXIT_NOT_JUDGED, EXIT_OK, UserError
from hazards.engine.campaign import LeasedCampaign
from hazards.engine.loop import TargetFactory, WorkItem, default_target_factory
from hazards.engine.junit import JUnitCase, JUnitSuite
from hazards.engine.leases import lease_candidates
from hazards.engine.sources import EvidenceAllocation, canary_sprt
from hazards.engine.stall import OFF
from hazards.engine.stats import Sprt
from hazards.engine.store import Store
from hazards.engine.verdict import Expect, ItemTally, Judgement, Verdict, judge, not_judged, skipped
from hazards.engine.verdict import exit_code as verdicts_exit_code

KIND = "check"
REPLAY_SHARE = 0.2  # of the GPU budget, for the database's failing points when it holds any
# A clean variant's requests grow to about this long once its first runs show what a launch
# costs (EvidenceAllocation.sized): a fast kernel's request of 200 launches was mostly its
# per-request cost. Not longer: a family that does not wait for each launch reports no
# heartbeat until a request's whole queue has run (on an H200, 0.25-s requests of
# barrier_layout, ordering and mma_pingpong showed 0.20-0.25-s gaps), and the stall floor
# (1.0 s) was measured under contention with requests of at most ~0.2 s
# (docs/results/hangs-h200.md).
CLEAN_REQUEST_S = 0.05
ItemsFor = Callable[[Family, list[Variant]], list[WorkItem]]


@dataclasses.dataclass
class VariantVerdict:
    """How one variant fared (a `hazards.engine.verdict.Verdict`: detected / went blind for
    a canary, clean / failed, error, skipped). `role` is 'canary' or 'clean'."""

    family: str
    variant: str
    role: str
    status: Verdict
    runs: int = 0
    failures: int = 0
    errors: int = 0
    message: str = ""
    time_s: float = 0.0
    launches: int = 0
    failed_launches: int = 0

    def __post_init__(self) -> None:
        self.status = Verdict(self.status)

    @property
    def launch_upper(self) -> float:
        """One-sided 95% upper bound on the failure rate per launch."""
        from hazards.engine.stats import upper_bound

        return upper_bound(min(self.failed_launches, self.launches), self.launches)

    @classmethod
    def of(cls, family: str, variant: str, expect: Expect | None, judgement: Judgement,
           tally: ItemTally | None = None, time_s: float = 0.0) -> "VariantVerdict":
        t = tally or ItemTally()
        return cls(family, variant, expect.noun if expect else "", judgement.verdict,
                   t.n, t.failures, t.errors, judgement.message, time_s)

    @property
    def judgement(self) -> Judgement:
        return Judgement(self.status, self.message)

    @property
    def ok(self) -> bool:
        return self.status.ok

    def line(self) -> str:
        """The verdict as one line of the check's output."""
        expect = Expect.DETECT if self.role == "canary" else Expect.CLEAN if self.role == "clean" else None
        return self.judgement.line(f"{self.family}/{self.variant}", expect)


@dataclasses.dataclass
class CheckResult:
    """Everything `hazards check` found; `exit_code` is the command's exit status."""

    findings: list[Any] = dataclasses.field(default_factory=list)
    static_note: str = ""
    verdicts: list[VariantVerdict] = dataclasses.field(default_factory=list)
    gpu_note: str = ""
    campaign_id: int | None = None
    started_at: float = dataclasses.field(default_factory=time.time)
    static_s: float = 0.0
    skipped_parts: set[str] = dataclasses.field(default_factory=set)  # "static", "gpu" (--skip)

    @property
    def static_failures(self) -> list[Any]:
        """Failing static findings that are hazards (or blind canaries), not blind spots."""
        from hazards.static_catalog import could_not_look

        blind = {id(f) for f in could_not_look(self.findings)}
        return [f for f in self.findings if getattr(f, "fails", True) and id(f) not in blind]

    @property
    def static_not_judged(self) -> list[Any]:
        """Static checks that could not run for a missing tool (not one the user skipped)."""
        from hazards.static_catalog import could_not_look

        return could_not_look(self.findings)

    @property
    def blind(self) -> list[VariantVerdict]:
        return [v for v in self.verdicts if v.status is Verdict.WENT_BLIND]

    @property
    def exit_code(self) -> int:
        """1 a hazard (a failing static finding, a canary that went blind, a clean variant
        that failed); else 3 when something could not be judged (a missing tool, no GPU,
        only errors); else 0."""
        from hazards.static_catalog import static_exit_code

        codes = {static_exit_code(list(self.findings)), verdicts_exit_code(v.status for v in self.verdicts)}
        if self.judged_nothing:
            codes.add(EXIT_NOT_JUDGED)
        return EXIT_HAZARD if EXIT_HAZARD in codes else EXIT_NOT_JUDGED if EXIT_NOT_JUDGED in codes else EXIT_OK

    @property
    def judged_nothing(self) -> bool:
        """Neither part judged anything: the static part was skipped or every one of its
        checks was (`--skip clang,nvcc,nvdisasm`), and no GPU check ran (skipped, or none).
        Whatever `--skip` named, such a check never passes."""
        static_judged = 0 if "static" in self.skipped_parts else getattr(self.findings, "judged", None)
        return static_judged == 0 and all(v.status is Verdict.SKIPPED for v in self.verdicts)

    def junit_suites(self) -> list[JUnitSuite]:
        """A static suite and a GPU suite for the JUnit writer. What could not be judged is
        an error case, what the user skipped a skipped case: never a passed one."""
        from hazards.static.checks import CHECK_SKIPPED
        from hazards.static_catalog import NOT_JUDGED

        static = JUnitSuite("hazards.check.static", started_at=self.started_at,
                            stdout="\n".join(f.format() for f in self.findings) if self.findings else self.static_note)
        for f in self.findings:
            canary = static_canary_judgement(f)
            name = f"{f.check} {f.subject or f.location()}"
            if canary is not None:
                case = canary.junit_case(f"canary {f.subject or f.location()}", "hazards.static.canary")
                case.text = f.format() if not canary.ok else ""
                static.cases.append(case)
            elif f.check in NOT_JUDGED:  # could not look: exit 3, an error, never a hazard's failure
                static.cases.append(not_judged(f.message).junit_case(name, f"hazards.static.{f.check}"))
            elif f.check == CHECK_SKIPPED.id:
                static.cases.append(skipped(f.message).junit_case(name, f"hazards.static.{f.check}"))
            elif f.fails:
                static.cases.append(JUnitCase(name, f"hazards.static.{f.check}",
                                              status="failure", message=f.message, type=f.check, text=f.format()))
        if not static.cases:
            static.cases.append(JUnitCase("static checks", "hazards.static", self.static_s,
                                          status="skipped" if "static" in self.skipped_parts else "passed",
                                          message=self.static_note))
        gpu = JUnitSuite("hazards.check.gpu", started_at=self.started_at, stdout=self.gpu_note)
        for v in self.verdicts:
            gpu.cases.append(v.judgement.junit_case(f"{v.family}/{v.variant} ({v.role})",
                                                    f"hazards.check.{v.family}", v.time_s))
        return [static, gpu]

    def to_json(self) -> dict[str, Any]:
        """What `hazards check --json` prints: the exit code, the static findings, one verdict
        per variant (with its failure rate) and where the runs are stored."""
        from hazards.engine.stats import format_rate

        verdicts = [{"family": v.family, "variant": v.variant, "role": v.role, "verdict": v.status.value,
                     "ok": v.ok, "runs": v.runs, "failures": v.failures, "errors": v.errors,
                     "rate_text": format_rate(v.failures, v.runs - v.errors), "message": v.message,
                     "launches": v.launches, "failed_launches": v.failed_launches,
                     "launch_rate_text": format_rate(min(v.failed_launches, v.launches), v.launches),
                     "launch_upper": v.launch_upper if v.launches else None,
                     "time_s": v.time_s} for v in self.verdicts]
        return {"ok": self.exit_code == 0, "exit_code": self.exit_code, "campaign": self.campaign_id,
                "skipped": sorted(self.skipped_parts), "static_s": round(self.static_s, 2),
                "static": {"note": self.static_note, "failing": len(self.static_failures),
                           "not_judged": [f.subject or f.location() for f in self.static_not_judged],
                           "findings": [f.to_dict() for f in self.findings]},
                "gpu_note": self.gpu_note, "verdicts": verdicts}

    def summary_lines(self) -> list[str]:
        """Plain-text verdict, one line per variant and per static problem, plus the headline."""
        from hazards.static.checks import CHECK_SKIPPED, TOOL_KILLED

        lines = []
        if self.static_note:
            lines.append(f"static: {self.static_note}")
        for f in self.static_failures:
            lines.append(f"static FAIL {f.location()}: [{f.check}] {f.message}")
        for f in self.static_not_judged:
            lines.append(f"static NOT JUDGED {f.subject or f.location()}: {f.message}")
        for f in self.findings:
            if f.check == CHECK_SKIPPED.id:
                lines.append(f"static skip {f.subject or f.location()}: {f.message}")
        if self.gpu_note:
            lines.append(self.gpu_note)
        for v in self.verdicts:
            lines.append(v.line())
        hazards = len(self.static_failures) + sum(1 for v in self.verdicts if v.status.is_hazard)
        unjudged = len(self.static_not_judged) + sum(1 for v in self.verdicts if v.status is Verdict.ERROR)
        n_skipped = sum(1 for v in self.verdicts if v.status is Verdict.SKIPPED)
        if self.judged_nothing and self.exit_code == EXIT_NOT_JUDGED and not unjudged:
            lines.append("check JUDGED NOTHING: every static check and every GPU check was skipped "
                         "(--skip); name less to skip, or install what is missing")
        elif self.exit_code == EXIT_HAZARD:
            lines.append(f"check FAILED ({hazards} problem(s)" + (f", {unjudged} not judged)" if unjudged else ")"))
        elif self.exit_code == EXIT_NOT_JUDGED:
            checks = {f.check for f in self.static_not_judged}
            if checks == {TOOL_KILLED.id} and unjudged == len(self.static_not_judged):  # nothing is missing
                what = ("a tool was killed before it finished (tool-killed): run the check again, with more "
                        "memory free if the OOM killer ended it")
            else:
                what = "install what is missing, or name what not to check with --skip"
            lines.append(f"check COULD NOT JUDGE {unjudged} item(s) (listed above): {what}")
        elif "gpu" in self.skipped_parts and n_skipped:
            lines.append(f"check passed for the static part only: {n_skipped} GPU check(s) SKIPPED")
        elif "static" in self.skipped_parts:
            lines.append("check passed for the GPU part only: the static checks were SKIPPED")
        else:
            lines.append("check passed")
        return lines


def run_static(paths: Iterable[str], families: list[str] | None = None,
               skip_tools: Iterable[str] = (), observer: Any = None) -> tuple[list[Any], str]:
    """(findings, note) of hazards.static_catalog on the catalog (the selected families that
    have static checks; all when `families` is None) and the paths; `observer` (the
    progress display) is told what is being compiled."""
    from hazards.static_catalog import run_static_checks, static_family_names

    names = None if families is None else [f for f in families if f in static_family_names()]
    findings = run_static_checks([Path(p) for p in paths], catalog=names != [], families=names, skip=skip_tools,
                                 observer=observer)
    detected = sum(1 for f in findings if f.check == "canary-detected")
    failing = sum(1 for f in findings if f.fails)
    note = f"{len(findings)} finding(s), {failing} failing, {detected} static canaries detected"
    return findings, note + ("" if names != [] else " (no static checks in the selected families)")


def static_canary_judgement(finding: Any) -> Judgement | None:
    """A static canary's verdict from its catalog finding (None for any other finding)."""
    from hazards.static_catalog import CANARY_BLIND, CANARY_DETECTED

    if finding.check == CANARY_DETECTED.id:
        return Judgement(Verdict.DETECTED, finding.message)
    if finding.check == CANARY_BLIND.id:
        return Judgement(Verdict.WENT_BLIND, finding.message)
    return None


def gpu_variants(family: Family) -> list[Variant]:
    """The variants a GPU check runs: canaries that stress should detect, and clean ones."""
    if not family.binary:
        return []
    return [v for v in family.variants if preset_expectation(family, v) is not None]


def default_items_for(family: Family, variants: list[Variant]) -> list[WorkItem]:
    """Work items for these variants on the family's launch server (`<binary> --serve`,
    built or taken from the build cache by `hazards.stress_family.family_item`); the
    server resolves each variant's parameter preset from its name, as `hazards stress` does."""
    from hazards.stress_family import family_item  # looked up per call: tests stand in for the build

    server = family_item(family)
    return [variant_item(family, v, server) for v in variants]


def family_items(family: Family, variants: list[Variant], items_for: ItemsFor) -> list[WorkItem]:
    """`items_for`'s work items through the one recipe (`variant_item`): what stress must
    report for each variant at its point, and what proves a detection."""
    by_name = {v.name: v for v in variants}
    return [variant_item(family, by_name[i.variant], i, params=i.params) if i.variant in by_name
            else dataclasses.replace(i, target=i.target or family.name, anomalies=tuple(family.harness_anomalies))
            for i in items_for(family, variants)]


def family_builds(families: list[Family], variants_of: Callable[[Family], list[Variant]], items_for: ItemsFor,
                  observer: Any = None) -> list[tuple[Family, list[WorkItem] | UserError]]:
    """Each family's work items (`family_items`: its launch server built, or taken from the
    build cache), up to the machine's cores built at once and shown by `observer` (the
    progress display) as what is compiling; a family that cannot be built gets its UserError."""
    from hazards.static.runner import Subject, run_subjects

    def build(family: Family) -> list[Any]:
        try:
            return [family_items(family, variants_of(family), items_for)]
        except UserError as e:
            return [e]

    subjects = [Subject(f"{f.name} launch server", lambda f=f: build(f)) for f in families]
    # list(): consumed to its end (a zip over the families stops one short, and the phase
    # left open that way counted as abandoned and killed the compilers started meanwhile)
    built = list(run_subjects(subjects, observer=observer if families else None, what="family builds",
                              doing="compiling"))
    return [(f, out[0]) for f, out in zip(families, built)]


def select_families(names: Iterable[str] | None) -> list[Family]:
    """Every family, or the named ones (UserError for an unknown name)."""
    from hazards.families import all_families, get_family

    names = [n for n in (names or ()) if n]
    return [get_family(n) for n in names] if names else all_families()


def _sprt_for(item: WorkItem) -> Sprt:
    return canary_sprt(item)


def run_check(*, budget_s: float, families: Iterable[str] | None = None, paths: Iterable[str] = (),
              static_only: bool = False, skip: Iterable[str] = (), skip_tools: Iterable[str] = (),
              store: Store | None = None, lock_dir: str | None = None,
              wait_s: float = 60.0, exclusive: bool = False, items_for: ItemsFor | None = None,
              target_factory: TargetFactory = default_target_factory, catalog: list[Family] | None = None,
              explore_item_for: Callable[[Family], Any] | None = None,
              log: Callable[[str], None] = lambda s: None, observer: Any = None,
              forensics: Any = None, stall: str | float = "auto") -> CheckResult:
    """Run the pre-merge check and return its result (the caller writes JUnit / exits).

    `skip` names the parts not to run ("static", "gpu"; `static_only` is "gpu"), reported
    as skipped; `skip_tools` the tools the static checks must not use. Without a usable
    GPU the GPU checks are errors (nothing judged), unless "gpu" is skipped. `observer` (a
    progress display, `hazards.engine.campaign.RunObserver`) watches the GPU part;
    `forensics` (a ForensicsPolicy) decides what each hang's collectors read.
    `explore_item_for(family)` makes the work items of replayed explore points (default:
    requests to the family's launch server)."""
    if not budget_s > 0:
        raise UserError(f"budget must be positive, got {budget_s!r}")
    parts = set(skip) | ({"gpu"} if static_only else set())
    if {"gpu", "static"} <= parts:
        raise UserError("--skip gpu and --skip static together leave nothing to check")
    res = CheckResult(skipped_parts=parts)
    fams = catalog if catalog is not None else select_families(families)
    t0 = time.monotonic()
    static = StaticPart(paths, [f.name for f in fams] if families else None, skip_tools, observer,
                        skipped="static" in parts)
    try:
        _run_check_gpu(res, static, fams, families, parts, budget_s, t0, store, lock_dir, wait_s, exclusive,
                       items_for, target_factory, explore_item_for, log, observer, forensics, stall)
        # inside: Ctrl-C while waiting for a static part that outlasts the GPU part (a cold build
        # cache) ends its compilers too (their own process groups: the terminal's SIGINT misses them)
        static.into(res)
    except BaseException:
        static.abandon()
        raise
    return res


class StaticPart:
    """The static part of a check, on a thread of its own beside the GPU part: the static
    checks are compilers and disassemblers on the CPU, the GPU part's supervisor mostly waits
    on its servers, so the check takes about the longer of the two instead of their sum (an
    H100's check spent 27 s on the static part before its GPU part began). Its progress is a
    phase of its own on the observer (`CampaignProgress.phase`)."""

    def __init__(self, paths: Iterable[str], families: list[str] | None, skip_tools: Iterable[str],
                 observer: Any, *, skipped: bool = False) -> None:
        import threading

        from hazards.engine.proctree import ToolGroups
        from hazards.static.runner import path_subjects

        self.skipped = skipped
        self.findings: Any = []
        self.note = "SKIPPED (--skip static)" if skipped else ""
        self.seconds = 0.0
        self._error: BaseException | None = None
        self._tools = ToolGroups()  # the compilers the static part starts, and only those
        self._thread = None
        if skipped:
            return
        paths, skip_tools = list(paths), list(skip_tools)
        path_subjects(paths)  # a path that does not exist is bad input now, not after the GPU part
        phase = observer.phase() if hasattr(observer, "phase") else observer
        t0 = time.monotonic()

        def body() -> None:
            try:
                with self._tools.current():
                    self.findings, self.note = run_static(paths, families, skip_tools, observer=phase)
            except BaseException as e:  # raised in the caller's thread by `wait`
                self._error = e
            finally:
                self.seconds = time.monotonic() - t0

        self._thread = threading.Thread(target=body, name="hz-check-static", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Until the static part has ended; its exception (a bad path, ...) is raised here."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=0.2)  # short joins: Ctrl-C reaches the caller's thread
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def into(self, res: "CheckResult") -> None:
        """Wait for the static part and put what it found into `res`."""
        self.wait()
        res.findings, res.static_note, res.static_s = self.findings, self.note, self.seconds

    def abandon(self) -> None:
        """The check is ending early (Ctrl-C, an error): kill the compilers the static part
        started (never a GPU part's server, build or debugger) and give its thread a moment
        to see it."""
        if self._thread is None:
            return
        # not gated on is_alive(): on Python 3.11 a Ctrl-C that interrupts `wait`'s join marks the
        # thread stopped while it still runs (threading._wait_for_tstate_lock); a finished
        # part's tools have all ended, and kill() skips those
        self._tools.kill()
        self._thread.join(timeout=5)


def _run_check_gpu(res: CheckResult, static: StaticPart, fams: list[Family], families: Iterable[str] | None,
                   parts: set[str], budget_s: float, t0: float, store: Store | None, lock_dir: str | None,
                   wait_s: float, exclusive: bool, items_for: ItemsFor | None, target_factory: TargetFactory,
                   explore_item_for: Callable[[Family], Any] | None, log: Callable[[str], None], observer: Any,
                   forensics: Any, stall: str | float) -> None:
    """The GPU part of `run_check` (while `static` runs beside it) into `res`."""
    wanted = [(f, v) for f in fams for v in gpu_variants(f)]
    names = ", ".join(f"{f.name}/{v.name}" for f, v in wanted)
    if "gpu" in parts:
        res.gpu_note = f"GPU checks SKIPPED (--skip gpu): {names}" if wanted else ""
        res.verdicts = [VariantVerdict.of(f.name, v.name, preset_expectation(f, v), skipped("--skip gpu"))
                        for f, v in wanted]
        return
    if not wanted:
        static.into(res)
        if families and not res.findings and "static" not in parts:
            raise UserError(f"nothing to check in {', '.join(f.name for f in fams)}: no static checks and no "
                            f"launch server (families: {', '.join(f.name for f in select_families(None))})")
        res.gpu_note = "GPU checks: no family with a launch server in the selection"
        return
    if not lease_candidates():
        why = "no usable GPU (NVML/nvidia-smi found none, or CUDA_VISIBLE_DEVICES is empty)"
        res.gpu_note = f"GPU checks NOT RUN: {why}; pass --skip gpu to check the static part only; not run: {names}"
        res.verdicts = [VariantVerdict.of(f.name, v.name, preset_expectation(f, v), not_judged(why))
                        for f, v in wanted]
        return
    items: list[WorkItem] = []
    for f, built in family_builds([f for f in fams if gpu_variants(f)], gpu_variants, items_for or default_items_for,
                                  observer):
        if isinstance(built, UserError):  # a family that cannot be built is an error of that family
            res.verdicts += [VariantVerdict.of(f.name, v.name, preset_expectation(f, v), not_judged(str(built)))
                             for v in gpu_variants(f)]
        else:
            items.extend(built)
    if items:
        _run_gpu_part(res, items, budget_s - (time.monotonic() - t0), store, lock_dir, wait_s, exclusive,
                      target_factory, log, observer, [f for f in fams if gpu_variants(f)], explore_item_for,
                      forensics, stall)


def _run_gpu_part(res: CheckResult, items: list[WorkItem], budget_s: float, store: Store | None,
                  lock_dir: str | None, wait_s: float, exclusive: bool, target_factory: TargetFactory,
                  log: Callable[[str], None], observer: Any = None, families: list[Family] = (),
                  explore_item_for: Callable[[Family], Any] | None = None, forensics: Any = None,
                  stall: str | float = "auto") -> None:
    from hazards.engine.stall import StallPolicy
    own_store = store is None
    store = store or Store()
    try:
        try:
            frame = LeasedCampaign.acquire(store, "hazards check", lock_dir=lock_dir, wait_s=wait_s,
                                           exclusive=exclusive, target_factory=target_factory,
                                           forensics=forensics)
        except UserError as e:  # every GPU busy (or gone since we looked): nothing judged
            res.gpu_note = f"GPU checks could not run: {e}"
            res.verdicts += [VariantVerdict.of(i.target, i.variant, i.expectation, not_judged(str(e)))
                             for i in items]
            return
        frame.stall = StallPolicy(stall, store)
        db = store.layout.examples
        replay = _known_points(families, db)
        with frame:
            res.gpu_note = f"GPU checks on {frame.describe()}"
            log(res.gpu_note)
            t0 = time.monotonic()
            cid = frame.create(KIND, {"budget_s": budget_s, "items": [i.to_json() for i in items],
                                      "replay": [f.name for f in replay]})
            res.campaign_id = cid
            # a grown request's timeout grows with it: only a stall window keeps a hang in it
            # quick to find, so `--stall off` keeps each item's own requests (the old behaviour)
            source = EvidenceAllocation(items, sprt_for=_sprt_for, recheck=False,
                                        request_s=None if stall == OFF else CLEAN_REQUEST_S)
            frame.run(cid, source, budget_s=max(1.0, budget_s * (1.0 - REPLAY_SHARE) if replay else budget_s),
                      observer=observer)
            dropped = source.dropped()
            busy = _busy_seconds(store, cid)
            for key, it in source.by_key.items():
                ev = source.evidence[key]
                decision = "failed" if it.expectation is not Expect.DETECT and ev.failures else source.decision(key)
                j = judge(it.expectation, ev, decision=decision, dropped=dropped.get(key))
                if it.expectation is Expect.CLEAN and j.verdict is Verdict.CLEAN and ev.launches:
                    j = Judgement(j.verdict, f"{j.message}; per launch <= {ev.launch_upper():.2g} at 95% "
                                             f"({ev.launches:,} launches)")
                v = VariantVerdict.of(it.target, it.variant, it.expectation, j, ev, busy.get(key, (0, 0.0))[1])
                v.launches, v.failed_launches = ev.launches, ev.failed_launches
                res.verdicts.append(v)
                log(v.line())
            left = budget_s - (time.monotonic() - t0)
            for k, fam in enumerate(replay):
                v = _replay_verdict(frame, fam, db, left / (len(replay) - k), explore_item_for)
                left = budget_s - (time.monotonic() - t0)
                res.verdicts.append(v)
                log(v.line())
    finally:
        if own_store:
            store.close()


def _busy_seconds(store: Store, campaign_id: int) -> dict[str, tuple[int, float]]:
    """{item key: (runs, seconds of run time)} of a campaign."""
    from hazards.engine.soak import stored_time

    return stored_time(store, campaign_id)


def _known_points(families: Iterable[Family], database_dir: Path) -> list[Family]:
    """The families whose explore property has failing points in the example database."""
    from hazards.explore import database_entries

    if not database_dir.is_dir():
        return []
    return [f for f in families if database_entries(database_dir, f)]


def _replay_verdict(frame: LeasedCampaign, family: Family, database_dir: Path, budget_s: float,
                    explore_item_for: Callable[[Family], Any] | None) -> VariantVerdict:
    """Replay a family's known failing explore points, judged by the two-way oracle: a point
    the model calls safe that still fails is a hazard (failed), one it calls hazardous that
    no longer fails within its launch budget a blind spot (went blind)."""
    from hazards.explore import Agreement, ExploreOptions, explore_family

    label = "explore points"
    if budget_s < 0.5:
        return VariantVerdict(family.name, label, "explore", Verdict.SKIPPED,
                              message="the budget ended before the known failing points could be replayed")
    try:
        out = explore_family(frame, family, ExploreOptions(budget_s=budget_s, replay=True, point_runs=0),
                             database_dir=database_dir, campaign_name=f"check replay {family.name}",
                             item_for=explore_item_for(family) if explore_item_for else None)
    except UserError as e:
        return VariantVerdict(family.name, label, "explore", Verdict.ERROR, message=str(e))
    ev = [o.evidence for o in out.observations]
    runs, failures = sum(e.n for e in ev), sum(e.failures for e in ev)
    where = f"{len(out.observations)} replayed run(s) of {out.replayed} known point(s)"
    kinds = {f.kind for f in out.disagreements}
    if Agreement.MISSED in kinds:
        status, why = Verdict.FAILED, next(f for f in out.disagreements if f.kind is Agreement.MISSED)
    elif Agreement.GAP in kinds:
        status, why = Verdict.WENT_BLIND, out.disagreements[0]
    elif out.exit_code == 3 or not out.judged:
        return VariantVerdict(family.name, label, "explore", Verdict.ERROR, runs, failures,
                              message=f"{where}: nothing judged ({out.error or out.stop_reason or 'errors only'})")
    else:
        return VariantVerdict(family.name, label, "explore", Verdict.CLEAN, runs, failures,
                              message=f"{where}: every one agrees with the static model now")
    return VariantVerdict(family.name, label, "explore", status, runs, failures,
                          message=f"{where}: {why.headline()} at {why.repro}")
