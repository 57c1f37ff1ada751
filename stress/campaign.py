"""The leased-campaign frame: lease(s), telemetry, the store and warm targets, around the loop.

Every command that runs anything opens one `LeasedCampaign` and runs its campaign(s) in it;
an example and what the frame owns are in docs/campaigns.md."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from . import recovery
from .containment import CONTAINMENT
from .errors import NotJudged, StoreError, UserError
from .stall import StallPolicy
from .loop import (ARTIFACT_POLICIES, GpuStats, StoreSink, TargetFactory, WorkItem, WorkSource,
                                     close_targets, default_target_factory, run_local, warm_target)
from .leases import GpuLease, acquire_free, lease_candidates, no_gpu_lease
from .outcome import HOST, RunResult
from .proctree import start_ticks
from .stats import Sprt
from .store import Campaign, OutcomeCounts, Store

# Campaign statuses written by the frame.
RUNNING = "running"          # in progress, or its supervisor died (resume it)
COMPLETE = "complete"        # ran what it was asked to (the runs, the budget)
STOPPED = "stopped"          # stopped early: first failure (--until-fail) or an SPRT decision
INTERRUPTED = "interrupted"  # Ctrl-C / SIGTERM reached the loop, or the loop failed

NO_GPU_VISIBLE = "no usable GPU (NVML/nvidia-smi found none, or CUDA_VISIBLE_DEVICES is empty)"

OnResult = Callable[[int, RunResult, dict[str, int]], None]  # (seq, result, counts so far)


@dataclasses.dataclass
class LoopStart:
    """What a `RunObserver` is told as a campaign's loop starts."""

    campaign_id: int
    kind: str
    items: list[WorkItem]
    total: int | None       # runs the campaign makes at most, stored ones included (None: budget-bound)
    budget_s: float         # this session's time budget (math.inf: none)
    counts: dict[str, int]  # outcome counts stored before this session
    leases: list[GpuLease]


class RunObserver(Protocol):
    """Watches a campaign's loop (every call may come from any GPU's thread)."""

    def begin(self, start: LoopStart) -> None: ...
    def started(self, lease: GpuLease, item: WorkItem) -> None: ...
    def finished(self, seq: int, item: WorkItem, result: RunResult) -> None: ...
    def end(self, status: str, stop_reason: str | None) -> None: ...


def invocation(argv: list[str] | None = None) -> str:
    """The command line this process was started with, as a user would type it
    ('hazards soak --budget 30m'; `python -m hazards` and the console script alike)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    prog = Path(argv[0])
    name = prog.parent.name if prog.name == "__main__.py" else prog.name
    return shlex.join([name or "python3", *argv[1:]])


def session_context(cwd: str | None = None) -> dict[str, Any]:
    """Where and how a campaign session runs: the command, its folder and that folder's
    `git describe`, the host, the hazards and Python versions (the report shows them)."""
    from .targets.repro import git_describe

    cwd = cwd or os.getcwd()
    try:
        from importlib.metadata import version

        hz_version = version("gpu-hazards")
    except Exception:  # not installed (a checkout on PYTHONPATH)
        hz_version = None
    return {"command": invocation(), "cwd": cwd, "git_describe": git_describe(cwd), "host": socket.gethostname(),
            "hazards_version": hz_version, "python": sys.version.split()[0]}


def running_supervisor(camp: Campaign) -> dict[str, Any] | None:
    """The supervisor (pid, ticks, boot, host) of a 'running' campaign's last session, or None."""
    if camp.status != RUNNING:
        return None
    return (camp.spec.get("sessions") or [{}])[-1].get("supervisor") or None


def check_resumable(store: Store, campaign_id: int) -> None:
    """UserError when campaign `campaign_id` cannot be resumed now because its supervisor, on
    this host, still runs: a second supervisor would run the same campaign beside it."""
    camp = store.campaign(campaign_id)
    sup = running_supervisor(camp)
    if sup and sup.get("host") == HOST and sup.get("pid") != os.getpid() and recovery.supervisor_alive(sup):
        raise UserError(f"campaign {campaign_id} is still running (its supervisor, pid {sup['pid']}, is alive): "
                        f"wait for it to end, or stop it (kill -INT {sup['pid']}), then resume")


class NoGpuVisible(NotJudged):
    """No GPU is visible to this process (and the caller cannot run without one)."""


class NoGpuFree(UserError):
    """GPUs are visible but every one is leased by someone else (or not exclusive)."""


@dataclasses.dataclass
class CampaignSummary(OutcomeCounts):
    """Where a repeated campaign stands after `LeasedCampaign.repeat` (stored runs included)."""

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


class LeasedCampaign:
    """Leases + telemetry + store + warm targets: the frame every campaign runs in.

    Build one with `acquire` (leases the GPUs), `on_cpu` (the no-GPU pseudo-lease,
    telemetry off: tests, CPU-only commands), or directly from leases someone else holds
    (`owns_leases=False`: they are not released here; the Ray executor's pseudo-leases).
    `target_factory` makes the targets of work items (default: ServerTarget / CommandTarget /
    SanitizerTarget from the item); `run` and `repeat` may override it. Close it (or use it
    as a context manager): warm targets are closed, telemetry stopped, owned leases released.
    The store stays open (it is the caller's). `stall` (a `StallPolicy`, default `--stall
    auto` over this store's calibration) gives each run its stall window.
    """

    def __init__(self, store: Store, leases: list[GpuLease], *, telemetry: bool = True,
                 owns_leases: bool = False, target_factory: TargetFactory = default_target_factory,
                 forensics: Any = None) -> None:
        if not leases:
            raise ValueError("a leased campaign needs at least one lease")
        self.store, self.leases, self.owns_leases = store, list(leases), owns_leases
        self.target_factory = target_factory
        self.forensics = forensics  # a ForensicsPolicy, or None: hangs get the fixed collectors only
        self.stall = StallPolicy(store=store)
        self.say: Callable[[str], None] = _say  # where notes for the user go (stderr)
        self.caches: dict[str, dict[tuple, Any]] = {}
        self.campaign_id: int | None = None  # the campaign created or reopened last (an interrupt names it)
        self.monitor = None
        gpus = [lease for lease in self.leases if lease.is_gpu]
        if telemetry and gpus:
            from .telemetry import TelemetryMonitor

            self.monitor = TelemetryMonitor([lease.uuid for lease in gpus]).start()

    @classmethod
    def acquire(cls, store: Store, holder: str, *, max_gpus: int | None = None, lock_dir: str | None = None,
                wait_s: float = 0.0, exclusive: bool = False, telemetry: bool = True,
                without_gpu: bool = False,
                target_factory: TargetFactory = default_target_factory, forensics: Any = None) -> "LeasedCampaign":
        """Lease every free GPU this process may use (at most `max_gpus`), waiting up to
        `wait_s` for one. No GPU visible: the no-GPU pseudo-lease if `without_gpu`, else
        NoGpuVisible; every GPU busy: NoGpuFree naming the holders (both one-line UserErrors)."""
        if not lease_candidates():
            if without_gpu:
                return cls.on_cpu(store, holder, target_factory=target_factory, forensics=forensics)
            raise NoGpuVisible(NO_GPU_VISIBLE)
        leases, busy = acquire_free(holder, lock_dir=lock_dir, max_gpus=max_gpus, wait_s=wait_s,
                                    exclusive=exclusive)
        if not leases:
            raise NoGpuFree("; ".join(busy.values()) or "no GPU could be leased")
        return cls(store, leases, telemetry=telemetry, owns_leases=True, target_factory=target_factory,
                   forensics=forensics)

    @classmethod
    def on_cpu(cls, store: Store, holder: str = "hazards",
               target_factory: TargetFactory = default_target_factory, forensics: Any = None) -> "LeasedCampaign":
        """A frame on the no-GPU pseudo-lease: the children's environment is left as it is."""
        return cls(store, [no_gpu_lease(holder)], telemetry=False, owns_leases=True,
                   target_factory=target_factory, forensics=forensics)

    # -- what the frame holds --------------------------------------------------------------
    @property
    def on_gpu(self) -> bool:
        """False when the frame runs on the no-GPU pseudo-lease."""
        return any(lease.is_gpu for lease in self.leases)

    def describe(self) -> str:
        """'2 GPU(s): GPU-aaaa, GPU-bbbb' or 'no GPU'."""
        gpus = [lease.uuid or lease.gpu for lease in self.leases if lease.is_gpu]
        return f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "no GPU"

    def session(self) -> dict[str, Any]:
        """This frame as one entry of a campaign spec's `sessions`: when it started, the
        command and its context (`session_context`), each leased GPU with its name, the
        driver (from NVML, when the frame watches the GPUs), its supervisor (to tell later
        whether it died) and how its children are contained."""
        gpus = [lease.info() for lease in self.leases if lease.is_gpu]
        if self.monitor is not None:
            names = self.monitor.names()
            for g in gpus:
                if g.get("uuid") in names:
                    g["name"] = names[g["uuid"]]
        me = os.getpid()
        return {"started": time.time(), **session_context(), "gpus": gpus,
                "driver": self.monitor.driver if self.monitor is not None else None,
                "telemetry": None if self.monitor is None else self.monitor.xid_watch,
                "supervisor": {"pid": me, "ticks": start_ticks(me), "boot_id": recovery.boot_id(), "host": HOST},
                "containment": CONTAINMENT.describe()}

    def target(self, item: WorkItem, lease: GpuLease | None = None,
               target_factory: TargetFactory | None = None) -> Any:
        """The warm target `item` runs on on `lease` (default: the first), made if needed."""
        lease = lease or self.leases[0]
        return warm_target(self.caches.setdefault(lease.gpu, {}), item, lease,
                           target_factory or self.target_factory)

    def warm(self, item: WorkItem, target_factory: TargetFactory | None = None) -> None:
        """Start `item`'s target on every lease now (UserError if one cannot start), so a
        server that will not come up is one clear line before any run, not error runs."""
        for lease in self.leases:
            start = getattr(self.target(item, lease, target_factory), "start", None)
            if start is not None:
                start()

    # -- campaigns -------------------------------------------------------------------------
    def create(self, kind: str, spec: dict[str, Any], name: str | None = None) -> int:
        """A new campaign whose spec records this session; its id. Campaigns of dead
        supervisors are recovered first (`recover_interrupted`)."""
        self.recover_interrupted()
        campaign_id = self.store.create_campaign(kind, {**spec, "sessions": [self.session()]}, name=name)
        CONTAINMENT.track_campaign(self._store_key, campaign_id)
        self.campaign_id = campaign_id
        return campaign_id

    def reopen(self, campaign_id: int, kind: str) -> Campaign:
        """A stored campaign of `kind` to continue (UserError otherwise), this session added.
        If its supervisor died, what was cleaned up after it is said (`say`) once."""
        self.recover_interrupted()
        check_resumable(self.store, campaign_id)
        camp = self.store.campaign(campaign_id)
        if camp.kind != kind:
            raise UserError(f"campaign {campaign_id} is a {camp.kind!r} campaign, not a {kind!r} one")
        spec = dict(camp.spec)
        if "recovered" in spec:
            self.say(recovery_words(campaign_id, spec["recovered"]))
            spec["recovered_before"] = list(spec.get("recovered_before", [])) + [spec.pop("recovered")]
        spec["sessions"] = list(spec.get("sessions", [])) + [self.session()]
        self.store.update_campaign_spec(campaign_id, spec)
        CONTAINMENT.track_campaign(self._store_key, campaign_id)
        self.campaign_id = campaign_id
        return self.store.campaign(campaign_id)

    @property
    def _store_key(self) -> str:
        return str(self.store.path.resolve())

    def recover_interrupted(self) -> list[int]:
        """Mark 'interrupted' every campaign of this store left 'running' by a supervisor
        that died (after killing what it left running and removing its tripwire files, if
        nobody did yet); the spec of each keeps what was cleaned. Returns their ids."""
        marked: list[int] = []

        def mark(campaign_id: int, report: dict[str, Any]) -> bool:
            try:
                camp = self.store.campaign(campaign_id)
            except UserError:
                return True  # gone from the store: nothing to mark
            if camp.status == RUNNING:
                self.store.update_campaign_spec(campaign_id, {**camp.spec, "recovered": report})
                self.store.set_campaign_status(campaign_id, INTERRUPTED)
                marked.append(campaign_id)
            return True

        recovery.recover(self._store_key, mark)
        for camp in self.store.campaigns():  # dead supervisors whose record is gone too
            sup = running_supervisor(camp)
            if sup and sup.get("host") == HOST and camp.id not in marked and not recovery.supervisor_alive(sup):
                mark(camp.id, {"supervisor_pid": sup.get("pid"), "by": "next start", "at": time.time(),
                               "note": "no record of what it ran was left (runtime folder cleared, "
                                       "or the machine rebooted)"})
        return marked

    def run(self, campaign_id: int, source: WorkSource, *, budget_s: float = math.inf,
            target_factory: TargetFactory | None = None, on_result: Callable[[int, WorkItem, RunResult], None] | None = None,
            artifacts: str = "failures", evidence_json: bool = True,
            caches: dict[str, dict[tuple, Any]] | None = None, observer: RunObserver | None = None) -> list[GpuStats]:
        """Run the loop on every lease for campaign `campaign_id` until `source` is done or
        the budget ends; every run committed as it ends (`StoreSink`, its `artifacts`
        policy, evidence.json in every kept folder unless `evidence_json` is False, so the
        report can link a failing run's whole evidence; `on_result(seq, item, result)` after
        each commit). The campaign's status
        is set here; the telemetry summary and the items the source dropped go into its spec.
        `observer` (a `RunObserver`) is told as the loop begins, as each run starts and
        ends, and the status it ended with."""
        after = on_result
        if observer is not None:
            observer.begin(LoopStart(campaign_id, self.store.campaign(campaign_id).kind,
                                     list(getattr(source, "items", [])), getattr(source, "total", None), budget_s,
                                     self.store.counts(campaign_id), list(self.leases)))

            def after(seq: int, item: WorkItem, result: RunResult) -> None:
                if on_result is not None:
                    on_result(seq, item, result)
                observer.finished(seq, item, result)

        sink = StoreSink(self.store, campaign_id, artifacts=artifacts, on_result=after,
                         evidence_json=evidence_json)
        self.store.set_campaign_status(campaign_id, RUNNING)
        status, stats, ended = INTERRUPTED, [], False
        hangs_before = self.forensics.hangs if self.forensics is not None else 0
        try:
            with (self.forensics.installed(_forensics_base(budget_s, source), self.store)
                  if self.forensics is not None else contextlib.nullcontext()):
                stats = run_local(self.leases, source, sink, budget_s=budget_s, telemetry=self.monitor,
                                  target_factory=target_factory or self.target_factory,
                                  caches=self.caches if caches is None else caches,
                                  on_start=observer.started if observer is not None else None, stall=self.stall)
            status = STOPPED if getattr(source, "stop_reason", None) else COMPLETE
            ended = True
            cut = sum(st.cut_short for st in stats)
            if cut:  # not a verdict: the runs in flight when the budget (+ their stall window) ended
                self.say(f"{cut} run(s) still going when the budget ended were given up, not judged "
                         "(not stored; see docs/stall.md)")
        finally:
            if observer is not None:
                observer.end(status, getattr(source, "stop_reason", None))
            if self.forensics is not None and self.forensics.hangs > hangs_before:
                self.say(self.forensics.words())
            try:
                self._finish(campaign_id, source, status)
            except StoreError:
                if ended:  # otherwise the loop's own failure (it says where the runs went) wins
                    raise
        return stats

    def _finish(self, campaign_id: int, source: WorkSource, status: str) -> None:
        dropped = source.dropped() if hasattr(source, "dropped") else {}
        if self.monitor is not None or dropped or self.forensics is not None:
            spec = dict(self.store.campaign(campaign_id).spec)
            if self.monitor is not None:
                spec["telemetry"] = {**spec.get("telemetry", {}), **self.monitor.summary()}
            if dropped:
                spec["dropped"] = {**spec.get("dropped", {}), **dropped}
            if self.forensics is not None:
                spec["forensics"] = self.forensics.summary()
            self.store.update_campaign_spec(campaign_id, spec)
        self.store.set_campaign_status(campaign_id, status)
        CONTAINMENT.track_campaign(self._store_key, campaign_id, live=False)

    def repeat(self, target: Any = None, *, item: WorkItem | None = None, n: int, timeout: float,
               until_fail: bool = False, params: dict[str, Any] | Callable[[int], dict[str, Any]] | None = None,
               launches: int | None = None, sprt: Sprt | None = None, campaign_id: int | None = None,
               kind: str = "run", spec: dict[str, Any] | None = None, name: str | None = None,
               on_result: OnResult | None = None, artifacts: str = "failures", evidence_json: bool = True,
               target_factory: TargetFactory | None = None, observer: RunObserver | None = None,
               max_errors_in_a_row: int | None = None, budget_s: float = math.inf) -> CampaignSummary:
        """Run one thing until its campaign has `n` runs (the `Repeat` work source), or
        `budget_s` ends (a run still going then is cut short, not stored: `run`).

        What runs: `item` (its target made by the target factory with the lease's
        environment, and kept warm in the frame), or a ready-made `target` (the caller
        built it, owns it and closes it). New campaign (campaign_id None): created with
        `kind`, `spec` and `name`. Resume (campaign_id given): stored runs count towards
        `n`, numbering continues after the last stored seq, and `until_fail` / `sprt` see
        the stored runs first. `params` (a dict, or a function of the run's number in the
        campaign) and `launches` / `timeout` override the item's. `on_result(seq, result,
        counts)` is called after each run is committed; `observer` watches the loop (see
        `run`). `max_errors_in_a_row` error runs in a row stop it (default the `Repeat`
        source's; 0: never). A KeyboardInterrupt marks the campaign 'interrupted' and
        propagates.
        """
        from .sources import Repeat

        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout!r}")
        if artifacts not in ARTIFACT_POLICIES:
            raise ValueError(f"artifacts must be one of {ARTIFACT_POLICIES}, got {artifacts!r}")
        if (target is None) == (item is None):
            raise ValueError("give exactly one of target and item")
        item = _repeat_item(item, target, timeout, params, launches)
        t0 = time.monotonic()
        if campaign_id is None:
            if n < 1:
                raise ValueError(f"n must be >= 1, got {n!r}")
            campaign_id = self.create(kind, spec or {}, name=name)
        self.store.campaign(campaign_id)  # UserError if there is no such campaign
        prior = [sr.result for sr in self.store.iter_runs(campaign_id)]
        limits = {} if max_errors_in_a_row is None else {"max_errors_in_a_row": max_errors_in_a_row}
        source = Repeat(item, n, until_fail=until_fail, sprt=sprt, prior=prior,
                        params=params if callable(params) else None, **limits)
        counts = dict(source.counts)

        def observe(seq: int, _item: WorkItem, result: RunResult) -> None:
            counts[result.outcome.value] += 1
            if on_result is not None:
                on_result(seq, result, dict(counts))

        caches = None if target is None else {lease.gpu: {item.target_key: target} for lease in self.leases}
        self.run(campaign_id, source, budget_s=budget_s, target_factory=target_factory, on_result=observe,
                 artifacts=artifacts, evidence_json=evidence_json, caches=caches, observer=observer)
        status = self.store.campaign(campaign_id).status
        first = self.store.first_failure_seq(campaign_id)
        stop = source.stop_reason
        if stop == "first failure":
            stop = f"first failure at run {first}"
        return CampaignSummary(
            campaign_id=campaign_id, status=status, requested=n, counts=dict(source.counts),
            ran_now=source.ran_now, first_failure_seq=first, stop_reason=stop,
            elapsed_s=time.monotonic() - t0, sprt_decision=sprt.decision if sprt else None)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close every warm target, stop telemetry, release the leases the frame owns."""
        try:
            for cache in self.caches.values():
                close_targets(cache)
        finally:
            if self.monitor is not None:
                self.monitor.stop()
            if self.owns_leases:
                for lease in self.leases:
                    lease.release()

    def __enter__(self) -> "LeasedCampaign":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _forensics_base(budget_s: float, source: WorkSource) -> float:
    """The budget a campaign's forensics share is of: its time budget, or for a campaign of
    n runs the longest it may take (the runs still to make times their timeout)."""
    if math.isfinite(budget_s):
        return budget_s
    left = max(0, int(getattr(source, "total", 0) or 0) - int(getattr(source, "issued", 0) or 0))
    timeouts = [i.timeout_s for i in getattr(source, "items", [])] or [0.0]
    return left * max(timeouts)


def _say(line: str) -> None:
    try:
        print(f"hazards: {line}", file=sys.stderr)
    except OSError:  # a hung-up terminal
        pass


def recovery_words(campaign_id: int, report: dict[str, Any]) -> str:
    """One line: what was cleaned up after the supervisor of an interrupted campaign died."""
    who = f"supervisor pid {report.get('supervisor_pid')}"
    if report.get("note"):
        return f"campaign {campaign_id} was interrupted: its {who} died; {report['note']}"
    done = []
    if report.get("processes"):
        groups = ", ".join(str(g) for g in report.get("process_groups", []))
        done.append(f"killed {len(report['processes'])} process(es) it left running "
                    f"(pids {', '.join(map(str, report['processes']))}; process group(s) {groups})")
    if report.get("cgroups"):
        done.append(f"removed {len(report['cgroups'])} cgroup(s)")
    if report.get("files"):
        done.append(f"removed {len(report['files'])} tripwire file(s) ({', '.join(report['files'])})")
    by = "its guardian" if report.get("by") == "guardian" else "the next start"
    return (f"campaign {campaign_id} was interrupted: its {who} died; {by} "
            + ("; ".join(done) if done else "found nothing of it still running") + ".")


def _repeat_item(item: WorkItem | None, target: Any, timeout: float, params: Any,
                 launches: int | None) -> WorkItem:
    """The work item `repeat` runs: `item` with the run options laid over it, or a label
    for a ready-made target (its name; the variant its params name)."""
    fixed = dict(params) if isinstance(params, dict) else None
    if item is None:
        item = WorkItem(target=getattr(target, "name", "") or "", kind="ready-made",
                        variant=str((fixed or {}).get("variant", "")))
    return dataclasses.replace(item, timeout_s=timeout,
                               params=fixed if fixed is not None else item.params,
                               launches=launches if launches is not None else item.launches)
