"""The Ray executor writes the same campaign rows as the built-in one for the same fake targets.

A local Ray cluster with fake GPU resources (`ray.init(num_gpus=2, num_cpus=2)`) and the
fake GPUs of `hazards.engine.leases` ($HZ_FAKE_GPUS): each actor leases the GPU Ray gave it.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install \"gpu-hazards[ray]\"",
                         exc_type=ImportError)

from hazards.engine.loop import StoreSink, WorkItem, run_local  # noqa: E402
from hazards.engine.sources import Rotation  # noqa: E402
from hazards.engine.campaign import LeasedCampaign  # noqa: E402
from hazards.engine.executors import check_executor  # noqa: E402
from hazards.engine.executors.ray_executor import RayExecutor, loopback_kept, run_ray, run_soak_ray  # noqa: E402
from hazards.engine.leases import acquire_free, current_holders, read_lease_log, release_all  # noqa: E402
from hazards.engine.soak import run_soak  # noqa: E402
from hazards.engine.store import Store  # noqa: E402

# One Ray cluster at a time on this machine: every Ray test runs on the same xdist worker.
pytestmark = pytest.mark.xdist_group("ray-cluster")

FAKE = Path(__file__).resolve().parent.parent / "fakes" / "fake_server.py"
CMD = ("import json, os; print('HZ_RESULT ' + json.dumps({'ok': True, "
       "'cvd': os.environ.get('CUDA_VISIBLE_DEVICES'), 'params': json.loads(os.environ['HZ_PARAMS'])}))")


def fake_items() -> list[WorkItem]:
    server = (sys.executable, str(FAKE))
    return [
        WorkItem(target="fakefam", variant="steady", expect="clean", kind="server", argv=server,
                 params={"variant": "steady", "rate": 0.0}, launches=10, timeout_s=20),
        WorkItem(target="fakefam", variant="broken", expect="detect", kind="server", argv=server,
                 params={"variant": "broken", "rate": 0.3}, launches=10, timeout_s=20),
        WorkItem(target="py-command", kind="command", argv=(sys.executable, "-c", CMD),
                 params={"seed": 7}, timeout_s=30),
    ]


class EachTimes(Rotation):
    """Every item exactly `times` times (a finite, deterministic work source)."""

    def __init__(self, items: list[WorkItem], times: int) -> None:
        super().__init__(items)
        self.times = times

    def _eligible(self, st) -> bool:
        return st.dropped is None and st.runs + st.in_flight < self.times


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster with two fake GPUs, for the whole module (start-up takes seconds),
    its session in a folder of its own, removed after it."""
    temp_dir = tempfile.mkdtemp(prefix="hzray-", dir="/tmp")  # short: Ray's unix sockets live there
    saved = {k: os.environ.get(k) for k in ("HZ_FAKE_GPUS", "CUDA_VISIBLE_DEVICES")}
    os.environ["HZ_FAKE_GPUS"] = "0,1"  # inherited by the Ray workers started below
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    root = str(Path(__file__).resolve().parents[2])
    with loopback_kept():  # the cluster on 127.0.0.1, not on the machine's interface
        ray.init(num_gpus=2, num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"PYTHONPATH": root, "HZ_FAKE_GPUS": "0,1"}},
                 _temp_dir=temp_dir)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _rows(store: Store, cid: int) -> list[tuple]:
    """What must agree between executors: everything but timing, pids and which GPU ran it."""
    out = []
    for sr in store.runs(cid):
        r = sr.result
        metrics = {k: v for k, v in r.metrics.items() if k not in ("cvd", "worker_pid")}
        out.append((r.target, r.variant, json.dumps(r.params, sort_keys=True), r.outcome.value, r.reason,
                    r.error_kind, json.dumps(metrics, sort_keys=True), r.host))
    return sorted(out)


def _cvds(store: Store, cid: int) -> set:
    return {sr.result.metrics.get("cvd") for sr in store.runs(cid) if sr.result.target == "py-command"}


def test_ray_executor_writes_the_same_rows_as_the_local_executor(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0,1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lock_dir = str(tmp_path / "leases")
    store = Store(tmp_path / "results.db")

    local_id = store.create_campaign("soak", {"executor": "local"})
    leases, _ = acquire_free("local executor", lock_dir=lock_dir)
    assert [lease.gpu for lease in leases] == ["0", "1"]
    try:
        local_stats = run_local(leases, EachTimes(fake_items(), 6), StoreSink(store, local_id),
                                budget_s=120)
    finally:
        release_all(leases)

    ray_id = store.create_campaign("soak", {"executor": "ray"})
    with RayExecutor(lock_dir=lock_dir) as ex:
        assert sorted(lease.gpu.split(":")[1] for lease in ex.leases) == ["0", "1"]
        assert len(current_holders(lock_dir)) == 2  # each actor holds its GPU's lease
        ray_stats = run_ray(ex, EachTimes(fake_items(), 6), StoreSink(store, ray_id), budget_s=120)

    assert store.run_count(local_id) == store.run_count(ray_id) == 18
    assert _rows(store, local_id) == _rows(store, ray_id)
    assert [sr.seq for sr in store.runs(ray_id)] == list(range(1, 19))
    # Both executors spread the work over both GPUs, each child on its lease's device.
    assert _cvds(store, local_id) == _cvds(store, ray_id) == {"0", "1"}
    assert sum(s.runs for s in local_stats) == sum(s.runs for s in ray_stats) == 18
    # The default artifact policy on both: a folder per failing run, none for clean runs.
    for cid in (local_id, ray_id):
        folders = sorted(p.name for p in store.layout.artifacts(cid).iterdir())
        failing = sorted(f"run-{sr.seq:06d}" for sr in store.runs(cid) if sr.result.outcome.value != "clean")
        assert folders == failing and len(failing) == 6
    assert all(s.crashed is None for s in ray_stats)
    assert current_holders(lock_dir) == {}  # actors released their leases
    holders = {e["holder"] for e in read_lease_log(lock_dir) if e["event"] == "release"}
    assert {"ray soak actor 0", "ray soak actor 1"} <= holders


def test_ray_soak_writes_a_soak_campaign_like_the_local_soak(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("HZ_FAKE_GPUS", "0,1")
    lock_dir = str(tmp_path / "leases")
    store = Store(tmp_path / "results.db")
    with LeasedCampaign.acquire(store, "local soak", lock_dir=lock_dir, telemetry=False) as frame:
        local = run_soak(frame, fake_items(), budget_s=3.0)
    remote = run_soak_ray(store, fake_items(), budget_s=3.0, lock_dir=lock_dir)
    assert (local.status, remote.status) == ("complete", "complete")
    a, b = store.campaign(local.campaign_id), store.campaign(remote.campaign_id)
    assert a.kind == b.kind == "soak"
    assert a.spec["items"] == b.spec["items"]
    assert b.spec["executor"] == {"name": "ray", "address": None}
    assert len(b.spec["sessions"][0]["gpus"]) == 2
    # Same item set, same verdicts per item (counts differ: the budget is time, not runs).
    assert set(_rows(store, local.campaign_id)) == set(_rows(store, remote.campaign_id))
    assert remote.comparison is not None and remote.comparison.previous_id == local.campaign_id
    assert not remote.blind  # the canary (rate 0.3 of launches) failed on Ray too


def test_unknown_executor_is_a_user_error():
    from hazards.engine.errors import UserError

    with pytest.raises(UserError, match="unknown executor 'slurm'"):
        check_executor("slurm")
    assert check_executor("ray") == "ray"


def test_a_gpu_already_leased_on_its_host_stops_the_ray_soak_before_any_campaign(ray_cluster, tmp_path,
                                                                                 monkeypatch):
    from hazards.engine.errors import UserError

    monkeypatch.setenv("HZ_FAKE_GPUS", "0,1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lock_dir = str(tmp_path / "leases")
    store = Store(tmp_path / "results.db")
    held, _ = acquire_free("someone else on the host", lock_dir=lock_dir)
    try:
        with pytest.raises(UserError) as e:
            run_soak_ray(store, fake_items(), budget_s=3.0, lock_dir=lock_dir)
    finally:
        release_all(held)
    msg = str(e.value)
    assert "\n" not in msg and "could not lease its GPU" in msg and "someone else on the host" in msg, msg
    assert store.campaigns() == []
