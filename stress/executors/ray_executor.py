"""The Ray executor: one actor per GPU of a Ray cluster hosts that GPU's side of the loop.

`hazards soak --executor ray [--address ADDR]` spreads a soak over every GPU of a Ray
cluster (a local one when no address is given). Per GPU there is one `GpuActor`
(`num_gpus=1`), created with `max_restarts=0` and `max_task_retries=0`: a retried run
would hide a hang or a crash, so a lost actor is an error that ends the soak (resumable),
never a silent re-run.

Split of the per-GPU loop (`hazards.engine.executor.GpuLoop`):
- in the actor, on the GPU's host: the GPU lease (`hazards.engine.leases`, so local users of the
  host see it held), the warm targets (one launch server per binary, as locally), the
  watchdog of each run, and NVML telemetry around every run (per-host telemetry, attached
  to the run's evidence; the per-GPU campaign summary goes into the campaign spec);
- on the driver: a `GpuLoop` thread per actor, run by the same leased-campaign frame
  (`hazards.engine.campaign.LeasedCampaign`, over the actors' pseudo-leases), `run_local`
  and `run_soak` as the local executor, so what runs next, the budget, resume and the
  comparison with the previous soak are the same code, and every run is committed to the
  driver's store the moment its result arrives.

The driver-side loop sees each actor through a *pseudo-lease* (`GpuLease` describing the
remote lease, holding no lock here) and a target factory whose targets forward `run()` to
the actor. Remote hosts need the package installed (`pip install "gpu-hazards[ray]"`);
artifact folders are created on the host that ran the run (`RunResult.host` says which).
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from hazards.engine.errors import UserError
from hazards.engine.executor import GpuStats, WorkItem, default_target_factory, run_local
from hazards.engine.leases import GpuLease
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.targets.base import Target

STARTUP_TIMEOUT_S = 120.0   # actors created, leases taken, first call answered
ANSWER_MARGIN_S = 60.0      # beyond a run's own timeout + kill grace + hang collectors
CLOSE_TIMEOUT_S = 30.0


class ActorLost(BaseException):
    """A GPU actor died or stopped answering. A BaseException on purpose: the driver's
    GpuLoop must stop for that GPU (and the soak end, resumable), not record it as a run."""


def import_ray() -> Any:
    """The `ray` module, or a UserError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("the Ray executor needs Ray: pip install \"gpu-hazards[ray]\"") from None
    return ray


def _run_result(d: dict[str, Any]) -> RunResult:
    fields = {f.name for f in dataclasses.fields(RunResult)}
    kw = {k: v for k, v in d.items() if k in fields}
    kw["outcome"] = Outcome(kw["outcome"])
    return RunResult(**kw)


class GpuActor:
    """Lives in a Ray actor with one GPU (Ray set its CUDA_VISIBLE_DEVICES). Plain class;
    `RayExecutor` wraps it with `ray.remote`."""

    def __init__(self, holder: str, lock_dir: str | None = None, exclusive: bool = False,
                 telemetry: bool = True) -> None:
        from hazards.engine.leases import acquire_free

        got, refused = acquire_free(holder, lock_dir=lock_dir, max_gpus=1, exclusive=exclusive)
        if not got:
            why = "; ".join(refused.values()) or "no GPU visible (CUDA_VISIBLE_DEVICES=" \
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
            raise UserError(f"Ray actor on {os.uname().nodename} could not lease its GPU: {why}")
        self.lease = got[0]
        self.targets: dict[tuple, Any] = {}
        self.monitor = None
        if telemetry:
            from hazards.engine.telemetry import TelemetryMonitor

            self.monitor = TelemetryMonitor([self.lease.uuid]).start()

    def describe(self) -> dict[str, Any]:
        """The lease this actor holds, for the driver's pseudo-lease."""
        return {**self.lease.info(), "lock_path": str(self.lease.lock_path),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def _target(self, item: WorkItem) -> Any:
        key = item.target_key
        if key not in self.targets:
            self.targets[key] = default_target_factory(item, {**item.env, **self.lease.env()})
        return self.targets[key]

    def run(self, item_json: dict[str, Any], params: dict[str, Any], timeout: float, launches: int | None,
            artifact_dir: str | None) -> dict[str, Any]:
        """One run of `item` on this GPU; the RunResult as JSON (telemetry in its evidence)."""
        item = WorkItem.from_json(item_json)
        window = self.monitor.begin(self.lease.uuid) if self.monitor else None
        result = self._target(item).run(params, timeout=timeout, launches=launches,
                                        artifact_dir=Path(artifact_dir) if artifact_dir else None)
        if window is not None:
            tel = self.monitor.end(window)
            if tel:
                result.evidence = {**(result.evidence or {}), "telemetry": {**tel, "host": self.lease.host}}
        result.gpu_uuid = result.gpu_uuid or self.lease.uuid
        if artifact_dir and result.outcome is Outcome.CLEAN:
            # The driver's sink settles artifact folders, but cannot see this host's disk
            # when the actor runs elsewhere: an empty folder of a clean run goes here.
            try:
                os.rmdir(artifact_dir)
            except OSError:
                pass  # not empty (kept for the driver's policy) or already gone
        return result.to_json()

    def close_target(self, item_json: dict[str, Any]) -> None:
        """Close the warm target `item` runs on (kills its process group)."""
        target = self.targets.pop(WorkItem.from_json(item_json).target_key, None)
        if target is not None:
            target.close()

    def shutdown(self) -> dict[str, Any]:
        """Close every target, stop telemetry, release the lease; the telemetry summary."""
        for target in self.targets.values():
            try:
                target.close()
            except Exception:
                pass
        self.targets.clear()
        summary: dict[str, Any] = {}
        if self.monitor is not None:
            summary = {uuid: {**row, "host": self.lease.host} for uuid, row in self.monitor.summary().items()}
            self.monitor.stop()
        self.lease.release()
        return summary


class RemoteTarget(Target):
    """Driver-side stand-in for a target that lives in a GPU actor."""

    def __init__(self, executor: "RayExecutor", actor: Any, label: str, item: WorkItem) -> None:
        self.executor, self.actor, self.label, self.item = executor, actor, label, item
        self.name = item.target

    def run(self, params: dict[str, Any] | None = None, *, timeout: float, launches: int | None = None,
            artifact_dir: Path | None = None) -> RunResult:
        ray = self.executor.ray
        ref = self.actor.run.remote(self.item.to_json(), dict(params or {}), timeout, launches,
                                    str(artifact_dir) if artifact_dir else None)
        limit = timeout + self.executor.answer_margin_s
        try:
            return _run_result(ray.get(ref, timeout=limit))
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actor, no_restart=True)
            raise ActorLost(f"GPU actor {self.label} did not answer within {limit:g}s "
                            f"(run timeout {timeout:g}s): killed, not retried") from None
        except ray.exceptions.RayActorError as e:
            raise ActorLost(f"GPU actor {self.label} died: {e}") from None
        except ray.exceptions.RayTaskError as e:  # the run itself raised (e.g. a target that cannot start)
            cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else None
            raise (cause or RuntimeError(str(e))) from None

    def close(self) -> None:
        try:
            self.executor.ray.get(self.actor.close_target.remote(self.item.to_json()), timeout=CLOSE_TIMEOUT_S)
        except Exception:
            pass  # a dead actor's process tree died with it; shutdown() reports the rest


class RayExecutor:
    """Start (or join) a Ray cluster and one GpuActor per GPU; a context manager.

    `leases` (one pseudo-lease per actor) and `target_factory` plug into `run_local` /
    `run_soak` exactly like local leases do. `address=None` starts a local Ray instance;
    `init_kwargs` go to `ray.init` (e.g. `num_gpus=2, num_cpus=2` for a test cluster).
    """

    def __init__(self, *, address: str | None = None, max_gpus: int | None = None, lock_dir: str | None = None,
                 exclusive: bool = False, telemetry: bool = True, answer_margin_s: float = ANSWER_MARGIN_S,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        if max_gpus is not None and max_gpus < 1:
            raise UserError("max_gpus must be at least 1")
        self.ray = import_ray()
        self.address, self.max_gpus, self.lock_dir = address, max_gpus, lock_dir
        self.exclusive, self.telemetry, self.answer_margin_s = exclusive, telemetry, answer_margin_s
        self.init_kwargs = dict(init_kwargs or {})
        self.actors: dict[str, Any] = {}  # pseudo-lease visible_devices -> actor handle
        self.leases: list[GpuLease] = []
        self.telemetry_summary: dict[str, Any] = {}
        self._started_ray = False

    def __enter__(self) -> "RayExecutor":
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _init(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        kwargs = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR", **self.init_kwargs}
        if self.address is None:  # a local cluster: workers import this checkout like the driver does
            from hazards.engine.leases import FAKE_ENV, fake_gpus

            root = str(Path(__file__).resolve().parents[2])
            env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
            fakes = fake_gpus()
            if fakes is not None:  # tests: the local cluster gets the fake GPUs as its GPU resources
                env[FAKE_ENV] = os.environ[FAKE_ENV]
                kwargs.setdefault("num_gpus", len(fakes))
            kwargs.setdefault("runtime_env", {"env_vars": env})
        try:
            ray.init(address=self.address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UserError(f"cannot start or reach the Ray cluster{f' at {self.address}' if self.address else ''}: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        self._started_ray = True

    def open(self) -> None:
        """Create one actor per GPU of the cluster (at most `max_gpus`) and read their leases."""
        self._init()
        ray = self.ray
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if self.max_gpus is not None:
            gpus = min(gpus, self.max_gpus)
        if gpus < 1:
            raise UserError("the Ray cluster has no GPU resources")
        actor_cls = ray.remote(GpuActor).options(num_gpus=1, num_cpus=0, max_restarts=0, max_task_retries=0)
        actors = [actor_cls.remote(f"ray soak actor {i}", self.lock_dir, self.exclusive, self.telemetry)
                  for i in range(gpus)]
        try:
            infos = ray.get([a.describe.remote() for a in actors], timeout=STARTUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self._kill(actors)
            raise UserError(f"Ray GPU actors did not start within {STARTUP_TIMEOUT_S:g}s "
                            "(not enough free GPUs in the cluster?)") from None
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
            self._kill(actors)
            raise UserError(f"a Ray GPU actor failed to start: {str(e).strip().splitlines()[-1]}") from None
        for actor, info in zip(actors, infos):
            lease = GpuLease(gpu=f"{info['host']}:{info['gpu']}", uuid=info["uuid"], holder=info["holder"],
                             lock_path=Path(info["lock_path"]), pid=info["pid"], host=info["host"],
                             acquired_at=info["acquired_at"])
            self.actors[lease.visible_devices] = actor
            self.leases.append(lease)

    def target_factory(self, item: WorkItem, env: dict[str, str]) -> RemoteTarget:
        """`hazards.engine.executor.TargetFactory` for the driver's loops: the pseudo-lease's
        CUDA_VISIBLE_DEVICES in `env` names the actor that runs the target."""
        label = env["CUDA_VISIBLE_DEVICES"]
        return RemoteTarget(self, self.actors[label], label, item)

    def _kill(self, actors: list[Any]) -> None:
        for actor in actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass

    def close(self) -> None:
        """Shut every actor down (targets closed, leases released), then Ray if we started it."""
        ray = self.ray
        refs = {label: actor.shutdown.remote() for label, actor in self.actors.items()}
        for label, ref in refs.items():
            try:
                self.telemetry_summary.update(ray.get(ref, timeout=CLOSE_TIMEOUT_S) or {})
            except Exception:
                pass  # a lost actor: its host's OS dropped the lease with the process
        self._kill(list(self.actors.values()))
        self.actors.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def run_ray(executor: RayExecutor, source: Any, sink: Any, *, budget_s: float) -> list[GpuStats]:
    """`run_local` over the executor's actors: one driver-side GpuLoop per remote GPU."""
    return run_local(executor.leases, source, sink, budget_s=budget_s, target_factory=executor.target_factory)


def run_soak_ray(store: Any, items: list[WorkItem] | None, *, budget_s: float, resume: int | None = None,
                 name: str | None = None, address: str | None = None, max_gpus: int | None = None,
                 lock_dir: str | None = None, exclusive: bool = False, init_kwargs: dict[str, Any] | None = None,
                 telemetry: bool = True) -> Any:
    """`hazards.engine.soak.run_soak` on a Ray cluster; the SoakResult. A lost actor ends the soak
    with a UserError naming the campaign to resume (nothing is retried)."""
    from hazards.engine.campaign import LeasedCampaign
    from hazards.engine.soak import run_soak

    spec_extra = {"executor": {"name": "ray", "address": address}}
    with RayExecutor(address=address, max_gpus=max_gpus, lock_dir=lock_dir, exclusive=exclusive,
                     telemetry=telemetry, init_kwargs=init_kwargs) as ex:
        t0 = time.time()
        try:
            # telemetry is read in the actors, next to their GPUs (see `GpuActor.run`)
            with LeasedCampaign(store, ex.leases, telemetry=False, target_factory=ex.target_factory) as frame:
                res = run_soak(frame, items, budget_s=budget_s, resume=resume, name=name, spec_extra=spec_extra)
        except ActorLost as e:
            cid = resume or next((c.id for c in reversed(store.campaigns("soak")) if c.created >= t0 - 1), None)
            raise UserError(f"{e}; campaign {cid} stopped: continue it with "
                            f"`hazards soak --executor ray --resume {cid}`") from None
    if ex.telemetry_summary:
        spec = dict(store.campaign(res.campaign_id).spec)
        spec["telemetry"] = {**spec.get("telemetry", {}), **ex.telemetry_summary}
        store.update_campaign_spec(res.campaign_id, spec)
    return res
