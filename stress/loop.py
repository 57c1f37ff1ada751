"""The one run loop: a loop per leased GPU, each pulling work from a shared work source.

Every command that runs anything goes through it (`hazards run`, `repro`, `stress`, `check`,
`soak`, through the leased-campaign frame of `hazards.engine.campaign`). More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import json
import shutil

from .errors import StoreError
from .containment import CONTAINMENT
from .leases import GpuLease
from .outcome import Outcome, RunResult, item_key
from .store import Store, empty_counts
from .targets.base import CUT_SHORT, run_kw, supported_kw
from .verdict import Expect, Proof, expect_of
from .watchdog import labelled_run

ARTIFACT_POLICIES = ("failures", "all", "none")
OnRun = Callable[[int, "WorkItem", RunResult], None]  # (seq, item, result) after the commit
OnStart = Callable[[GpuLease, "WorkItem"], None]  # (lease, item) as a run starts on that lease's GPU


@dataclasses.dataclass
class WorkItem:
    """One thing to run. `kind` is 'server' (a request to a launch server) or 'command'.

    `expect` is what a correct check must report ('detect': a canary; 'clean'; None: runs
    are only counted). `anomalies` and `sanitizer` make its `proof` (what counts as seeing
    the hazard); a command item with `sanitizer` runs under that compute-sanitizer tool.
    """

    target: str
    variant: str = ""
    expect: str | None = None  # "detect" | "clean" | None
    kind: str = "server"
    argv: tuple[str, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    cwd: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    launches: int | None = None
    timeout_s: float = 20.0
    respawn_every: int = 0
    result_regex: str | None = None
    anomalies: tuple[str, ...] = ()
    sanitizer: str | None = None
    handshake_timeout_s: float | None = None  # server: wait for a new worker's handshake (None: the default)
    stall_s: float | None = None  # a run with progress, then none for this long, is a hang (None: timeout only)
    # server: the program writes tripwire breadcrumbs; its server gets a private tripwire file
    # (progress, and the hang's diagnosis) named from this names file (a C header or JSON)
    tripwire_names: str | None = None

    @property
    def expectation(self) -> Expect | None:
        return expect_of(self.expect)

    @property
    def proof(self) -> Proof:
        return Proof(self.sanitizer, tuple(self.anomalies))

    @property
    def key(self) -> str:
        return item_key(self.target, self.variant)

    @property
    def target_key(self) -> tuple:
        """Items with the same key share one warm target per GPU (one server per binary)."""
        if self.kind == "server":
            return ("server", self.argv, self.cwd, tuple(sorted(self.env.items())), self.respawn_every,
                    self.handshake_timeout_s, self.tripwire_names)
        return ("command", self.key, self.argv, self.cwd, tuple(sorted(self.env.items())), self.sanitizer)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["argv"], d["anomalies"] = list(self.argv), list(self.anomalies)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "WorkItem":
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in fields}
        kw["argv"], kw["anomalies"] = tuple(kw.get("argv", ())), tuple(kw.get("anomalies", ()))
        if "expect" not in d:  # a spec stored before expectations: its role word says it
            expect = expect_of(d.get("role"))
            kw["expect"] = expect.value if expect else None
        return cls(**kw)


def settle_artifacts(result: RunResult, folder: Path, keep: bool) -> None:
    """Point the result at its artifact folder, or remove the folder of a clean run."""
    if Outcome(result.outcome) is Outcome.CLEAN and not keep:
        # Only this run's own folder (made for it under our store) is ever removed.
        shutil.rmtree(folder, ignore_errors=True)
        result.artifact_dir = None
    elif result.artifact_dir is None and folder.exists():
        result.artifact_dir = str(folder)


class WorkSource(Protocol):
    """Decides what a GPU runs next. Must be thread-safe: every GPU loop calls it.
    (Optional: `stop_reason`, set when it ended the campaign early; `dropped()`, the items
    it stopped issuing and why.)"""

    def next_item(self, gpu: str) -> WorkItem | None: ...  # None: nothing left to run
    def report(self, item: WorkItem, result: RunResult) -> None: ...
    def finished(self) -> bool: ...


class Sink(Protocol):
    """Where results go. Must be thread-safe."""

    def allocate(self) -> tuple[int, Path | None]: ...  # (seq, artifact dir for the run)
    def record(self, seq: int, item: WorkItem, result: RunResult) -> None: ...
    # Optional: `release(seq)`, a number allocated for a run that will not be recorded.


class StoreSink:
    """Commits every run to the store as it ends (one lock: the store is one connection).

    `artifacts`: "failures" (default) gives each run a folder under the store's
    artifacts/campaign-N/ and removes it again when the run was clean (a long soak would
    otherwise leave one folder per request), "all" keeps every folder, "none" gives runs
    no folder (a hang collector then has nowhere to write). `evidence_json` writes the
    whole result (telemetry included) as evidence.json into every folder that is kept.
    `on_result(seq, item, result)` is called after each commit.

    A run the store cannot take (damaged file, full disk) is spilled to a file the store
    imports the next time it is opened for writing, and the sink raises `StoreError`
    naming that file; every later run is spilled too (the loops stop: see `run_local`).
    """

    def __init__(self, store: Store, campaign_id: int, *, artifacts: str = "failures",
                 on_result: OnRun | None = None, evidence_json: bool = False) -> None:
        if artifacts not in ARTIFACT_POLICIES:
            raise ValueError(f"artifacts must be one of {ARTIFACT_POLICIES}, got {artifacts!r}")
        self.store, self.campaign_id, self.artifacts, self.on_result = store, campaign_id, artifacts, on_result
        self.evidence_json = evidence_json
        self._mu = threading.Lock()
        self._seq = store.last_seq(campaign_id)
        self._released: set[int] = set()
        self._campaign = store.campaign(campaign_id)  # what a spill record needs, read while the store works
        self.spilled: list[str] = []  # where runs went that the store could not take
        self._failure = ""

    def _folder(self, seq: int) -> Path:
        return self.store.layout.artifacts(self.campaign_id) / f"run-{seq:06d}"

    def allocate(self) -> tuple[int, Path | None]:
        with self._mu:
            self._seq += 1
            seq = self._seq
        return seq, (self._folder(seq) if self.artifacts != "none" else None)

    def release(self, seq: int) -> None:
        """`seq` will not be recorded (the budget cut its run): its folder goes, and the
        numbering takes it back when nothing after it was allocated (the runs the budget
        cuts are the last ones; a number below a stored run stays a gap)."""
        if self.artifacts != "none":
            shutil.rmtree(self._folder(seq), ignore_errors=True)
        with self._mu:
            self._released.add(seq)
            while self._seq in self._released:
                self._released.discard(self._seq)
                self._seq -= 1

    def record(self, seq: int, item: WorkItem, result: RunResult) -> None:
        if self.artifacts != "none":
            settle_artifacts(result, self._folder(seq), keep=self.artifacts == "all")
        if self.evidence_json and result.artifact_dir:
            try:
                (Path(result.artifact_dir) / "evidence.json").write_text(
                    json.dumps(result.to_json(), indent=1, default=str))
            except OSError as e:  # a full disk must not lose the run itself
                result.evidence = {**(result.evidence or {}), "evidence_json_error": str(e)}
        with self._mu:
            try:
                if self.spilled:
                    raise StoreError(self._failure)
                self.store.record_run(self.campaign_id, result, seq=seq)
            except StoreError as e:
                where = self.store.spill(self.campaign_id, seq, result, self._campaign)
                self.spilled.append(where)
                self._failure = str(e)
                cid = self.campaign_id
                raise StoreError(f"{e}; run {seq} of campaign {cid} was kept in {where} (imported the next time "
                                 f"the store opens for writing, e.g. by `--resume {cid}`)") from None
        if self.on_result is not None:
            self.on_result(seq, item, result)


TargetFactory = Callable[[WorkItem, dict[str, str]], Any]


class GpuLost(Exception):
    """Raised by a target's `run` when its GPU is gone for the rest of the campaign (the
    host running it died, its executor killed it). `result` is the `error` run of the
    request that was in flight (it is recorded like any run); the loop then ends for that
    GPU only, with `GpuStats.lost` saying why. Never raised for anything the kernel did."""

    def __init__(self, result: RunResult) -> None:
        super().__init__(result.reason)
        self.result = result


def default_target_factory(item: WorkItem, env: dict[str, str]) -> Any:
    """A ServerTarget or CommandTarget for `item`, with `env` added to its environment."""
    from .targets import CommandTarget, ServerTarget

    if item.kind == "server":
        extra = {"handshake_timeout_s": item.handshake_timeout_s} if item.handshake_timeout_s else {}
        if not item.tripwire_names:
            return ServerTarget(list(item.argv), env=env, cwd=item.cwd, name=item.target,
                                respawn_every=item.respawn_every, **extra)
        from .targets.tripwire import TripwireTarget
        from .tripwire import Names, TripwireFile, load_names

        # a spec stored by another checkout may name a file that is not here: numbers, not names
        names = load_names(item.tripwire_names) if Path(item.tripwire_names).is_file() else Names()
        tw = TripwireFile()
        try:
            server = ServerTarget(list(item.argv), env={**env, **tw.env()}, cwd=item.cwd, name=item.target,
                                  respawn_every=item.respawn_every, **extra)
        except BaseException:
            tw.close()
            raise
        return TripwireTarget(server, tw, names=names, reset=False, owns_file=True)
    if item.kind == "command":
        target = CommandTarget(list(item.argv), env=env, cwd=item.cwd, name=item.target,
                               result_regex=item.result_regex)
        if item.sanitizer:
            from .targets.sanitizer import SanitizerTarget

            return SanitizerTarget(target, item.sanitizer, name=item.target)
        return target
    raise ValueError(f"unknown work item kind {item.kind!r}")


@dataclasses.dataclass
class GpuStats:
    """What one GPU loop did."""

    gpu: str
    uuid: str | None
    runs: int = 0
    launches: int = 0
    busy_s: float = 0.0
    elapsed_s: float = 0.0
    counts: dict[str, int] = dataclasses.field(default_factory=empty_counts)
    crashed: str | None = None
    cut_short: int = 0              # runs the budget ended before they could be judged (not stored)
    lost: str | None = None         # why this GPU was lost mid-campaign (`GpuLost`), if it was
    lost_at: float | None = None    # when (time.time())

    @property
    def launch_rate(self) -> float:
        """Launches per second of wall time."""
        return self.launches / self.elapsed_s if self.elapsed_s > 0 else 0.0


class GpuLoop:
    """The per-GPU loop: pull items from `source`, run them on this lease's GPU, `sink` them.

    Stops at `deadline` (time.monotonic()), when the source has nothing left, or when
    `stop` is set. A run in flight at the deadline gets at most its stall window more
    (so a run that stalled can still be judged a hang); then it is given up unjudged and
    not stored (`GpuStats.cut_short`): the budget holds whatever the run's timeout.
    `stall` (a `StallPolicy`, stress/stall.py) gives each run its stall window; without
    one, the item's own `stall_s`.
    `on_start(lease, item)`, when given, is called as each run starts (progress displays).
    `targets` is the warm-target cache to use ({WorkItem.target_key: target}); a caller
    that passes one keeps its targets open across loops and closes them itself (the
    leased-campaign frame does); without one the loop closes its own targets when it ends.
    """

    def __init__(self, lease: GpuLease, source: WorkSource, sink: Sink, *, deadline: float,
                 telemetry: Any = None, stop: threading.Event | None = None,
                 target_factory: TargetFactory = default_target_factory,
                 targets: dict[tuple, Any] | None = None, on_start: OnStart | None = None,
                 stall: Any = None) -> None:
        self.lease, self.source, self.sink, self.deadline = lease, source, sink, deadline
        self.stall = stall
        self.on_start = on_start
        self.telemetry, self.stop = telemetry, stop or threading.Event()
        self.target_factory = target_factory
        self.owns_targets = targets is None
        self.targets: dict[tuple, Any] = {} if targets is None else targets
        self.stats = GpuStats(lease.gpu, lease.uuid)

    def _target(self, item: WorkItem) -> Any:
        return warm_target(self.targets, item, self.lease, self.target_factory)

    def _prepared(self, item: WorkItem) -> WorkItem:
        """`item` with this run's stall window and (for a server not yet started here) the
        handshake wait the policy derives from stored start-up times."""
        if self.stall is None:
            return item
        changes: dict[str, Any] = {}
        window = self.stall.window(item)
        if window != item.stall_s:
            changes["stall_s"] = window
        if item.kind == "server" and item.handshake_timeout_s is None:
            from .targets.server import DEFAULT_HANDSHAKE_TIMEOUT_S

            wait = self.stall.handshake_timeout(item, DEFAULT_HANDSHAKE_TIMEOUT_S)
            if wait != DEFAULT_HANDSHAKE_TIMEOUT_S:
                changes["handshake_timeout_s"] = wait
        return dataclasses.replace(item, **changes) if changes else item

    def run_one(self, item: WorkItem) -> RunResult:
        """Run one item once on this GPU and judge it (never raises for a target's failure).
        A run the budget ended (`cut_short`) is returned but not stored."""
        item = self._prepared(item)
        seq, art = self.sink.allocate()
        window = self.telemetry.begin(self.lease.uuid) if self.telemetry else None
        t0 = time.time()
        try:
            cutoff = self.deadline + (item.stall_s or 0.0) if math.isfinite(self.deadline) else None
            target = self._target(item)
            with labelled_run(target=item.target, variant=item.variant, expect=item.expect, seq=seq):
                result = target.run(dict(item.params), timeout=item.timeout_s, launches=item.launches,
                                    artifact_dir=art, **supported_kw(target, run_kw(item.stall_s, cutoff)))
        except GpuLost as e:  # recorded below; `run` then ends this GPU's loop
            result = e.result
            self.stats.lost, self.stats.lost_at = result.reason, time.time()
        except Exception as e:  # a target that cannot start is our infrastructure's error
            result = RunResult(Outcome.ERROR, f"{type(e).__name__}: {e}", started_at=t0,
                               duration_s=time.time() - t0, error_kind="target_start")
        if self.stop.is_set():  # interrupted: its child was killed under it, it shows nothing
            return result
        if result.error_kind == CUT_SHORT:
            self.stats.cut_short += 1
            if window is not None:
                self.telemetry.end(window)
            release = getattr(self.sink, "release", None)
            if release is not None:
                release(seq)
            elif art is not None:
                shutil.rmtree(art, ignore_errors=True)
            return result
        result.target, result.variant = item.target, item.variant
        result.params = {**item.params, **(result.params or {})}
        result.gpu_uuid = result.gpu_uuid or self.lease.uuid
        if window is not None:
            tel = self.telemetry.end(window)
            if tel:
                result.evidence = {**(result.evidence or {}), "telemetry": tel}
        self.sink.record(seq, item, result)  # the sink settles the artifact folder
        self._count(result)
        return result

    def _count(self, result: RunResult) -> None:
        s = self.stats
        s.runs += 1
        s.counts[Outcome(result.outcome).value] += 1
        s.busy_s += max(0.0, result.duration_s or 0.0)
        launches = (result.metrics or {}).get("launches")
        if isinstance(launches, int) and launches > 0:
            s.launches += launches

    def run(self) -> GpuStats:
        """Loop until the deadline, the source runs dry, `stop`, or the GPU is lost; close every target."""
        t0 = time.monotonic()
        try:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                item = self.source.next_item(self.lease.gpu)
                if item is None:
                    break
                if self.on_start is not None:
                    self.on_start(self.lease, item)
                result = self.run_one(item)
                if result.error_kind == CUT_SHORT:
                    break  # the budget ended; nothing to report
                self.source.report(item, result)
                if self.stats.lost:
                    break
        except BaseException as e:  # record why this GPU stopped; the others carry on
            self.stats.crashed = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.stats.elapsed_s = time.monotonic() - t0
            if self.owns_targets:
                close_targets(self.targets)
        return self.stats


def warm_target(cache: dict[tuple, Any], item: WorkItem, lease: GpuLease, factory: TargetFactory) -> Any:
    """The warm target `item` runs on in `cache`, made by `factory` with the lease's
    environment the first time (items with the same `target_key` share it)."""
    key = item.target_key
    if key not in cache:
        cache[key] = factory(item, {**item.env, **lease.env()})
    return cache[key]


def close_targets(cache: dict[tuple, Any]) -> None:
    """Close every target of a warm-target cache (kills their process groups) and empty it."""
    for t in cache.values():
        try:
            t.close()
        except Exception:
            pass
    cache.clear()


def run_local(leases: list[GpuLease], source: WorkSource, sink: Sink, *, budget_s: float,
              telemetry: Any = None, target_factory: TargetFactory = default_target_factory,
              stop: threading.Event | None = None,
              caches: dict[str, dict[tuple, Any]] | None = None,
              on_start: OnStart | None = None, stall: Any = None) -> list[GpuStats]:
    """Run one `GpuLoop` per lease until the budget ends; per-GPU statistics.

    One lease runs its loop in the calling thread (Ctrl-C / SIGTERM interrupt the run in
    flight, whose target kills its children). Several run one thread each; Ctrl-C then
    sets the shared stop flag, kills every child (the runs in flight are given up, not
    recorded), waits for the loops to end, and re-raises. `caches`
    ({lease.gpu: warm-target cache}) keeps targets open beyond this call (see `GpuLoop`);
    `on_start(lease, item)` is called as each run starts.
    """
    stop = stop or threading.Event()
    deadline = time.monotonic() + max(0.0, budget_s)
    loops = [GpuLoop(lease, source, sink, deadline=deadline, telemetry=telemetry, stop=stop,
                     target_factory=target_factory, on_start=on_start, stall=stall,
                     targets=None if caches is None else caches.setdefault(lease.gpu, {}))
             for lease in leases]
    if len(loops) == 1:
        return [loops[0].run()]
    errors: list[BaseException] = []

    def body(loop: GpuLoop) -> None:
        try:
            loop.run()
        except BaseException as e:
            errors.append(e)
            if isinstance(e, StoreError):  # no loop can store anything: all stop after their run
                stop.set()

    threads = [threading.Thread(target=body, args=(lp,), name=f"hz-gpu-{lp.lease.gpu}", daemon=True)
               for lp in loops]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        stop.set()
        CONTAINMENT.stop_all()  # the runs in flight end now and are not recorded
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]
    return [lp.stats for lp in loops]
