"""The built-in local executor: one worker loop per leased GPU, all pulling from one queue.

The pieces are separate so that another executor (Ray: `executors/ray_executor.py`) can host
the same per-GPU loop in an actor:

- `WorkItem`: what to run (a family variant on its launch server, or a registered
  command/server target) and what a correct check must report for it (an expectation
  and a proof, `hazards.engine.verdict`), JSON-serialisable for campaign specs and resumes.
- a *work source* (`next_item(gpu)`, `report(item, result)`, `finished()`): decides what
  runs next and when to stop; `Rotation` (soak: every item, least-run first, until the
  budget ends) and `SprtStop` (check: each item until its SPRT verdict) are here.
- a *sink* (`allocate()`, `record(seq, item, result)`): where results go; `StoreSink`
  commits each run to the results store the moment it ends.
- `GpuLoop`: the per-GPU loop itself: a lease, a source, a sink, a deadline; one warm
  ServerTarget per server binary (shared by every variant of that family), a
  CommandTarget per command item, telemetry around every run.
- `run_local`: one thread per lease running a `GpuLoop`; returns per-GPU statistics.

A target that cannot even start (missing binary, build failure) produces `error` runs; a
source stops issuing an item after a few consecutive errors so a broken item cannot eat
the budget.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from hazards.engine.campaign import ARTIFACT_POLICIES
from hazards.engine.campaign import settle_artifacts  # the same policy as run_campaign
from hazards.engine.leases import GpuLease
from hazards.engine.outcome import Outcome, RunResult, item_key
from hazards.engine.stats import Sprt
from hazards.engine.store import Store, empty_counts
from hazards.engine.verdict import Expect, ItemTally, Proof, expect_of

MAX_CONSECUTIVE_ERRORS = 3


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
            return ("server", self.argv, self.cwd, tuple(sorted(self.env.items())), self.respawn_every)
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


class WorkSource(Protocol):
    """Decides what a GPU runs next. Must be thread-safe: every GPU loop calls it."""

    def next_item(self, gpu: str) -> WorkItem | None: ...  # None: nothing left to run
    def report(self, item: WorkItem, result: RunResult) -> None: ...
    def finished(self) -> bool: ...


class Sink(Protocol):
    """Where results go. Must be thread-safe."""

    def allocate(self) -> tuple[int, Path | None]: ...  # (seq, artifact dir for the run)
    def record(self, seq: int, item: WorkItem, result: RunResult) -> None: ...


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


class StoreSink:
    """Commits every run to the store as it ends (one lock: the store is one connection).

    `artifacts` is the policy of `hazards.engine.campaign.run_campaign`: "failures" (default) gives
    each run a folder under the store's artifacts/campaign-N/ and removes it again when
    the run was clean (a long soak would otherwise leave one folder per request), "all"
    keeps every folder, "none" gives runs no folder.
    """

    def __init__(self, store: Store, campaign_id: int, *, artifacts: str = "failures",
                 on_result: Callable[[WorkItem, RunResult], None] | None = None) -> None:
        if artifacts not in ARTIFACT_POLICIES:
            raise ValueError(f"artifacts must be one of {ARTIFACT_POLICIES}, got {artifacts!r}")
        self.store, self.campaign_id, self.artifacts, self.on_result = store, campaign_id, artifacts, on_result
        self._mu = threading.Lock()
        self._seq = store.last_seq(campaign_id)

    def _folder(self, seq: int) -> Path:
        return self.store.artifact_root(self.campaign_id) / f"run-{seq:06d}"

    def allocate(self) -> tuple[int, Path | None]:
        with self._mu:
            self._seq += 1
            seq = self._seq
        return seq, (self._folder(seq) if self.artifacts != "none" else None)

    def record(self, seq: int, item: WorkItem, result: RunResult) -> None:
        if self.artifacts != "none":
            settle_artifacts(result, self._folder(seq), keep=self.artifacts == "all")
        with self._mu:
            self.store.record_run(self.campaign_id, result, seq=seq)
        if self.on_result is not None:
            self.on_result(item, result)


TargetFactory = Callable[[WorkItem, dict[str, str]], Any]


def default_target_factory(item: WorkItem, env: dict[str, str]) -> Any:
    """A ServerTarget or CommandTarget for `item`, with `env` added to its environment."""
    from hazards.engine.targets import CommandTarget, ServerTarget

    if item.kind == "server":
        return ServerTarget(list(item.argv), env=env, cwd=item.cwd, name=item.target,
                            respawn_every=item.respawn_every)
    if item.kind == "command":
        target = CommandTarget(list(item.argv), env=env, cwd=item.cwd, name=item.target,
                               result_regex=item.result_regex)
        if item.sanitizer:
            from hazards.engine.targets.sanitizer import SanitizerTarget

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

    @property
    def launch_rate(self) -> float:
        """Launches per second of wall time."""
        return self.launches / self.elapsed_s if self.elapsed_s > 0 else 0.0


class GpuLoop:
    """The per-GPU loop: pull items from `source`, run them on this lease's GPU, `sink` them.

    Stops at `deadline` (time.monotonic()), when the source has nothing left, or when
    `stop` is set; a run in flight always finishes (bounded by its own timeout).
    """

    def __init__(self, lease: GpuLease, source: WorkSource, sink: Sink, *, deadline: float,
                 telemetry: Any = None, stop: threading.Event | None = None,
                 target_factory: TargetFactory = default_target_factory) -> None:
        self.lease, self.source, self.sink, self.deadline = lease, source, sink, deadline
        self.telemetry, self.stop = telemetry, stop or threading.Event()
        self.target_factory = target_factory
        self.targets: dict[tuple, Any] = {}
        self.stats = GpuStats(lease.gpu, lease.uuid)

    def _target(self, item: WorkItem) -> Any:
        key = item.target_key
        if key not in self.targets:
            self.targets[key] = self.target_factory(item, {**item.env, **self.lease.env()})
        return self.targets[key]

    def run_one(self, item: WorkItem) -> RunResult:
        """Run one item once on this GPU and judge it (never raises for a target's failure)."""
        seq, art = self.sink.allocate()
        window = self.telemetry.begin(self.lease.uuid) if self.telemetry else None
        t0 = time.time()
        try:
            result = self._target(item).run(dict(item.params), timeout=item.timeout_s,
                                            launches=item.launches, artifact_dir=art)
        except Exception as e:  # a target that cannot start is our infrastructure's error
            result = RunResult(Outcome.ERROR, f"{type(e).__name__}: {e}", started_at=t0,
                               duration_s=time.time() - t0, error_kind="target_start")
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
        """Loop until the deadline, the source runs dry, or `stop`; close every target."""
        t0 = time.monotonic()
        try:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                item = self.source.next_item(self.lease.gpu)
                if item is None:
                    break
                result = self.run_one(item)
                self.source.report(item, result)
        except BaseException as e:  # record why this GPU stopped; the others carry on
            self.stats.crashed = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.stats.elapsed_s = time.monotonic() - t0
            self.close()
        return self.stats

    def close(self) -> None:
        """Close every warm target of this loop (kills their process groups)."""
        for t in self.targets.values():
            try:
                t.close()
            except Exception:
                pass
        self.targets.clear()


def run_local(leases: list[GpuLease], source: WorkSource, sink: Sink, *, budget_s: float,
              telemetry: Any = None, target_factory: TargetFactory = default_target_factory,
              stop: threading.Event | None = None) -> list[GpuStats]:
    """Run one `GpuLoop` thread per lease until the budget ends; per-GPU statistics.

    Ctrl-C sets the shared stop flag, waits for the runs in flight, and re-raises.
    """
    stop = stop or threading.Event()
    deadline = time.monotonic() + max(0.0, budget_s)
    loops = [GpuLoop(lease, source, sink, deadline=deadline, telemetry=telemetry, stop=stop,
                     target_factory=target_factory) for lease in leases]
    errors: list[BaseException] = []

    def body(loop: GpuLoop) -> None:
        try:
            loop.run()
        except BaseException as e:
            errors.append(e)

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
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]
    return [lp.stats for lp in loops]
