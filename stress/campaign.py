"""The campaign loop: run a target N times, store every run the moment it ends.

Every command that repeats a target (`hazards run`, and later stress, soak, repro) goes
through `run_campaign`. The loop owns the bookkeeping that must be right everywhere:
sequence numbers, immediate commits (a SIGKILLed supervisor loses at most the run in
flight), resume of an interrupted campaign up to its requested total, early stop at the
first failure or on an SPRT decision, and the campaign's final status.
"""
from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.stats import Sprt
from hazards.engine.store import OutcomeCounts, Store, empty_counts

# Campaign statuses written by the loop.
RUNNING = "running"          # in progress, or its supervisor died (resume it)
COMPLETE = "complete"        # ran the requested number of runs
STOPPED = "stopped"          # stopped early: first failure (--until-fail) or an SPRT decision
INTERRUPTED = "interrupted"  # Ctrl-C / SIGTERM reached the loop


class Target(Protocol):
    """What the loop needs from a target (CommandTarget, ServerTarget, test doubles)."""

    def run(self, params: dict | None = None, *, timeout: float, launches: int | None = None,
            artifact_dir: Path | None = None) -> RunResult: ...


Params = dict[str, Any] | Callable[[int], dict[str, Any]] | None
OnResult = Callable[[int, RunResult, dict[str, int]], None]


@dataclasses.dataclass
class CampaignSummary(OutcomeCounts):
    """Where a campaign stands after `run_campaign` returns (stored runs included)."""

    campaign_id: int
    status: str
    requested: int
    counts: dict[str, int]
    ran_now: int
    first_failure_seq: int | None
    stop_reason: str | None
    elapsed_s: float
    sprt_decision: str | None = None

    def to_json(self, conf: float = 0.95) -> dict[str, Any]:
        lo, hi = self.ci(conf)
        return {
            "campaign": self.campaign_id, "status": self.status, "requested": self.requested,
            "n": self.n, "counts": dict(self.counts), "failures": self.failures,
            "errors": self.errors, "judged": self.judged, "rate": self.rate(),
            "ci": [lo, hi], "ci_conf": conf, "ci_method": "exact",
            "upper_one_sided": self.upper(conf), "first_failure_seq": self.first_failure_seq,
            "stop_reason": self.stop_reason, "ran_now": self.ran_now, "elapsed_s": self.elapsed_s,
            "sprt_decision": self.sprt_decision,
        }


ARTIFACT_POLICIES = ("failures", "all", "none")


def settle_artifacts(result: RunResult, folder: Path, keep: bool) -> None:
    """Point the result at its artifact folder, or remove the folder of a clean run."""
    if Outcome(result.outcome) is Outcome.CLEAN and not keep:
        # Only this run's own folder (made for it under our store) is ever removed.
        shutil.rmtree(folder, ignore_errors=True)
        result.artifact_dir = None
    elif result.artifact_dir is None and folder.exists():
        result.artifact_dir = str(folder)


def run_campaign(
    target: Target,
    store: Store,
    *,
    n: int,
    timeout: float,
    until_fail: bool = False,
    params: Params = None,
    campaign_id: int | None = None,
    kind: str = "run",
    spec: dict[str, Any] | None = None,
    name: str | None = None,
    launches: int | None = None,
    sprt: Sprt | None = None,
    on_result: OnResult | None = None,
    artifacts: str = "failures",
) -> CampaignSummary:
    """Run `target` until the campaign has `n` runs, recording each one as it ends.

    New campaign (campaign_id None): created with `kind`, `spec` and `name`.
    Resume (campaign_id given): stored runs count towards `n`, numbering continues after
    the last stored seq, and `until_fail` / `sprt` see the stored runs first (a campaign
    that already met its stop condition runs nothing more).
    `params` is a dict for every run or a function of the run's seq.
    `on_result(seq, result, counts)` is called after each run is committed.
    `artifacts`: "failures" (default) gives each run a folder under the store's
    artifacts/campaign-N/ and removes it again when the run was clean; "all" keeps every
    run's folder; "none" gives runs no folder (a hang collector then has nowhere to write).
    A KeyboardInterrupt marks the campaign 'interrupted' and propagates.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0, got {timeout!r}")
    if artifacts not in ARTIFACT_POLICIES:
        raise ValueError(f"artifacts must be one of {ARTIFACT_POLICIES}, got {artifacts!r}")
    t0 = time.monotonic()
    if campaign_id is None:
        campaign_id = store.create_campaign(kind, spec or {}, name=name)
    else:
        store.campaign(campaign_id)  # UserError if it does not exist
    counts = empty_counts()
    first_failure: int | None = None
    for stored in store.iter_runs(campaign_id):
        counts[Outcome(stored.result.outcome).value] += 1
        if first_failure is None and Outcome(stored.result.outcome).is_failure:
            first_failure = stored.seq
        if sprt is not None and stored.result.outcome is not Outcome.ERROR:
            sprt.update(Outcome(stored.result.outcome).is_failure)
    seq = store.last_seq(campaign_id)
    ran_now = 0

    def stop_reason() -> str | None:
        if until_fail and first_failure is not None:
            return f"first failure at run {first_failure}"
        if sprt is not None and sprt.decision is not None:
            return f"SPRT {sprt.decision}"
        return None

    store.set_campaign_status(campaign_id, RUNNING)
    status = RUNNING
    try:
        while sum(counts.values()) < n and stop_reason() is None:
            seq += 1
            run_params = params(seq) if callable(params) else dict(params or {})
            art = store.artifact_root(campaign_id) / f"run-{seq:06d}" if artifacts != "none" else None
            result = target.run(run_params, timeout=timeout, launches=launches, artifact_dir=art)
            if art is not None:
                settle_artifacts(result, art, keep=artifacts == "all")
            store.record_run(campaign_id, result, seq=seq)
            ran_now += 1
            outcome = Outcome(result.outcome)
            counts[outcome.value] += 1
            if outcome.is_failure and first_failure is None:
                first_failure = seq
            if sprt is not None and outcome is not Outcome.ERROR:
                sprt.update(outcome.is_failure)
            if on_result is not None:
                on_result(seq, result, dict(counts))
        status = STOPPED if stop_reason() is not None else COMPLETE
    except KeyboardInterrupt:
        status = INTERRUPTED
        raise
    finally:
        if status != RUNNING:
            store.set_campaign_status(campaign_id, status)
    return CampaignSummary(
        campaign_id=campaign_id, status=status, requested=n, counts=counts, ran_now=ran_now,
        first_failure_seq=first_failure, stop_reason=stop_reason(),
        elapsed_s=time.monotonic() - t0, sprt_decision=sprt.decision if sprt else None)
