"""A bisection on the engine: one campaign per commit in the store, runs through the loop.

`run_bisection` opens the leased-campaign frame (`hazards.engine.campaign.LeasedCampaign`,
one GPU lease, or none on a machine without GPUs), records the bisection as a campaign of
kind `bisect` (its spec: what is bisected, the commits, and which campaign holds each
commit's runs) and hands `hazards.bisect.search.bisect` a `StoreSide`: each commit's runs
are a campaign of kind `bisect-commit`, run by the `Repeat` work source (the bad and good
ends until enough failures or runs; every other commit until its SPRT decides), in a built
checkout of that commit (`hazards.bisect.history.Checkouts`). More in docs/bisect.md.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from hazards.engine.errors import UserError
from hazards.engine.loop import WorkItem
from hazards.engine.outcome import Outcome
from hazards.engine.sources import Repeat
from hazards.engine.stats import Sprt, format_rate, rate_ci
from hazards.engine.store import Store
from hazards.bisect.history import BUILD_TIMEOUT_S, Checkouts, Commit
from hazards.bisect.search import LIKE_BAD, LIKE_GOOD, MEASURED, SKIPPED, UNDECIDED, Bisection, Judged, bisect

KIND = "bisect"
COMMIT_KIND = "bisect-commit"
MAX_ERRORS_IN_A_ROW = 5  # a commit whose test errs this often in a row is untestable (skipped)


@dataclasses.dataclass
class Plan:
    """What is bisected and how: the `bisect` campaign's spec."""

    repo: str
    good: str
    bad: str
    commits: list[Commit]
    argv: list[str] | None = None     # the test command (run in each commit's checkout)
    family: str | None = None         # or a catalog family variant, rebuilt from each commit's standalone/
    variant: str | None = None
    build: str | None = None
    timeout_s: float = 60.0
    budget: int = 2000
    alpha: float = 0.01
    beta: float = 0.01
    threshold: float | None = None
    scratch: str = ""
    per_commit: dict[str, int] = dataclasses.field(default_factory=dict)   # sha -> campaign id
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)      # sha -> why it cannot be tested

    def to_spec(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["commits"] = [[c.sha, c.subject] for c in self.commits]
        return d

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "Plan":
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in spec.items() if k in names}
        d["commits"] = [Commit(sha, subject) for sha, subject in spec["commits"]]
        return cls(**d)


class StoreSide:
    """The `Side` of a real bisection: runs stored per commit, in built checkouts."""

    def __init__(self, frame: Any, bisect_id: int, plan: Plan, checkouts: Checkouts,
                 say: Callable[[str], None]) -> None:
        self.frame, self.store, self.bisect_id, self.plan = frame, frame.store, bisect_id, plan
        self.checkouts, self.say = checkouts, say
        self.ran_now = 0

    def _save(self) -> None:
        spec = {**self.store.campaign(self.bisect_id).spec, **self.plan.to_spec()}
        self.store.update_campaign_spec(self.bisect_id, spec)

    def _new_campaign(self, index: int) -> int:
        """The commit's campaign, made once it has something to run."""
        c = self.plan.commits[index]
        cid = self.frame.create(COMMIT_KIND, {"bisect": self.bisect_id, "commit": c.sha, "subject": c.subject,
                                              "index": index})
        self.plan.per_commit[c.sha] = cid
        self._save()
        return cid

    def _item(self, folder: Path, sha: str) -> WorkItem:
        """The test at this commit (a command: its variant is the commit, so `hazards stats`
        shows each commit's rate on a row of its own)."""
        plan = self.plan
        if plan.family is None:
            return WorkItem(target=Path(plan.argv[0]).name, variant=sha[:12], kind="command", argv=tuple(plan.argv),
                            cwd=str(folder), timeout_s=plan.timeout_s)
        from hazards.families import get_family
        from hazards.engine.build import build_family
        from hazards.family import HEADER_NAME

        fam = get_family(plan.family)
        source = folder / "standalone" / (fam.source_dir or fam.name)
        if not source.is_dir():
            raise UserError(f"no {source.relative_to(folder)} at this commit")
        exe = build_family(folder / "standalone", fam.source_dir or fam.name, fam.binary,
                           generated={HEADER_NAME: fam.table_header()})
        return WorkItem(target=fam.name, variant=plan.variant or "", kind="command", argv=(str(exe), "--once"),
                        params={"variant": plan.variant}, cwd=str(folder), timeout_s=plan.timeout_s)

    def _skip(self, index: int, why: str) -> Judged:
        self.plan.skipped[self.plan.commits[index].sha] = why
        self._save()
        self.say(f"{self._name(index)}: skipped, {why}")
        return Judged(index, SKIPPED, why=why)

    def _name(self, index: int) -> str:
        return f"commit {index}/{len(self.plan.commits) - 1} {self.plan.commits[index].sha[:12]}"

    def _runs(self, index: int, cap: int, until_failures: int = 0, test: Sprt | None = None) -> Judged:
        sha = self.plan.commits[index].sha
        if sha in self.plan.skipped:
            return Judged(index, SKIPPED, why=self.plan.skipped[sha])
        cid = self.plan.per_commit.get(sha)
        prior = [sr.result for sr in self.store.iter_runs(cid)] if cid is not None else []
        judged = sum(1 for r in prior if Outcome(r.outcome) is not Outcome.ERROR)
        n = len(prior) + max(0, cap - judged)
        # The stored runs are replayed first: a commit they already decide is neither built nor run.
        source = Repeat(WorkItem(target="not built yet", kind="command"), max(1, n), until_failures=until_failures,
                        sprt=test, prior=prior, max_errors_in_a_row=MAX_ERRORS_IN_A_ROW)
        if n > len(prior) and not source.finished():
            folder, why = self.checkouts.prepare(sha)
            if folder is None:
                return self._skip(index, why)
            try:
                source.item = self._item(folder, sha)
            except UserError as e:
                return self._skip(index, str(e))
            if cid is None:
                cid = self._new_campaign(index)
            else:
                self.frame.reopen(cid, COMMIT_KIND)
            self.frame.run(cid, source, artifacts="failures")
            self.ran_now += source.ran_now
        k = source.failures
        judged = sum(v for o, v in source.counts.items() if o != Outcome.ERROR.value)
        if judged == 0 and (source.cannot_start or source.errors_in_a_row):
            return self._skip(index, f"untestable: {source.last_error or source.cannot_start}")
        verdict = MEASURED
        if test is not None:
            verdict = {"accept_h1": LIKE_BAD, "accept_h0": LIKE_GOOD}.get(test.decision or "", UNDECIDED)
        return Judged(index, verdict, k, judged)

    def measure(self, index: int, until_failures: int, cap: int) -> Judged:
        j = self._runs(index, cap, until_failures=until_failures)
        if j.verdict != SKIPPED:
            self.say(f"{self._name(index)} ({'bad' if index else 'good'} end): {format_rate(j.failures, j.runs)} "
                     f"in {j.runs} runs")
        return j

    def judge(self, index: int, test: Sprt, cap: int) -> Judged:
        j = self._runs(index, cap, test=test)
        if j.verdict != SKIPPED:
            self.say(f"{self._name(index)}: {j.verdict} after {j.runs} runs ({format_rate(j.failures, j.runs)})")
        return j


def rate_json(j: Judged | None) -> dict[str, Any] | None:
    if j is None or j.runs == 0:
        return None
    lo, hi = rate_ci(j.failures, j.runs)
    return {"failures": j.failures, "runs": j.runs, "rate": j.failures / j.runs, "ci95": [lo, hi],
            "in_words": format_rate(j.failures, j.runs)}


def result_json(b: Bisection, plan: Plan, bisect_id: int, store: Store) -> dict[str, Any]:
    """The `--json` object: culprit (full id), confidence, every commit tested, runs spent."""
    commits = plan.commits

    def entry(j: Judged, role: str) -> dict[str, Any]:
        c = commits[j.index]
        return {"commit": c.sha, "subject": c.subject, "index": j.index, "role": role, "verdict": j.verdict,
                "runs": j.runs, "failures": j.failures, "rate": rate_json(j), "why": j.why or None,
                "campaign": plan.per_commit.get(c.sha)}

    tested = [entry(b.bad_end, "bad end")] if b.bad_end.runs or b.bad_end.verdict == SKIPPED else []
    if b.good_end.runs or b.good_end.verdict == SKIPPED:
        tested.append(entry(b.good_end, "good end"))
    tested += [entry(j, "tested") for j in b.judged]
    culprit = commits[b.culprit] if b.culprit is not None else None
    after = next((j for j in [b.bad_end, *b.judged] if j.index == b.culprit), None)
    return {
        "bisect": bisect_id, "store": str(store.path), "status": b.status, "reason": b.reason or None,
        "culprit": culprit.sha if culprit else None, "subject": culprit.subject if culprit else None,
        "confidence": b.confidence, "rate_before": rate_json(b.before), "rate_after": rate_json(after),
        "candidates": [commits[i].sha for i in b.candidates], "runs": b.runs,
        "design": b.design.to_json() if b.design else None, "ends_p": b.end_p,
        "good": commits[0].sha, "bad": commits[-1].sha, "commits": tested,
    }


def run_bisection(store: Store, plan: Plan, *, resume: int | None, lease: Any, say: Callable[[str], None],
                  build_timeout_s: float = BUILD_TIMEOUT_S,
                  on_campaign: Callable[[int], None] = lambda campaign_id: None) -> tuple[Bisection, int]:
    """Bisect `plan` in a leased frame (resume: the stored bisection `resume`); the outcome
    and the bisection's campaign id (also given to `on_campaign` as soon as it exists, so an
    interrupted command can say how to resume). The user's checkout is never touched."""
    from hazards.engine.campaign import COMPLETE, INTERRUPTED, STOPPED, LeasedCampaign

    checkouts = Checkouts(Path(plan.repo), Path(plan.scratch), plan.build, build_timeout_s=build_timeout_s)
    with LeasedCampaign.acquire(store, "hazards bisect", max_gpus=1, lock_dir=lease.lock_dir, wait_s=lease.wait_s,
                                exclusive=lease.exclusive, without_gpu=True) as frame:
        if resume is None:
            bisect_id = frame.create(KIND, plan.to_spec())
        else:
            frame.reopen(resume, KIND)
            bisect_id = resume
        on_campaign(bisect_id)
        side = StoreSide(frame, bisect_id, plan, checkouts, say)
        status = INTERRUPTED
        try:
            t0 = time.monotonic()
            outcome = bisect(len(plan.commits) - 1, side, budget=plan.budget, threshold=plan.threshold,
                             alpha=plan.alpha, beta=plan.beta)
            spec = {**store.campaign(bisect_id).spec, "result": result_json(outcome, plan, bisect_id, store),
                    "ran_now": side.ran_now, "seconds_now": round(time.monotonic() - t0, 3)}
            store.update_campaign_spec(bisect_id, spec)
            status = COMPLETE if outcome.status == "found" else STOPPED
        finally:
            store.set_campaign_status(bisect_id, status)
    return outcome, bisect_id

