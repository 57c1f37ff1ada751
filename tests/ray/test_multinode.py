"""Soaks across hosts: `hazards soak --executor ray --address HEAD` on a real multi-node cluster.

One cluster for the module (conftest: a head without GPUs, node-a with one fake GPU, node-b
with two, each a `ray start` process with its own environment and lease folder). The
driver is a separate `python3 -m hazards soak` process, part of no node. The tests run in
file order and the last one kills node-a for good.
"""
from __future__ import annotations

import ipaddress
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray", reason="Ray is an optional extra: pip install \"gpu-hazards[ray]\"",
                    exc_type=ImportError)

from cluster import NODES, REPO, ray_env  # noqa: E402

from hazards.engine.executors.ray_executor import is_loopback_host  # noqa: E402
from hazards.engine.leases import read_lease_log  # noqa: E402
from hazards.engine.outcome import HOST  # noqa: E402
from hazards.engine.store import Store  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray-cluster")]

FAKE_SERVER = REPO / "tests" / "fakes" / "fake_server.py"
PY = sys.executable
CVD_LINE = ("import json, os, sys; print('HZ_RESULT ' + json.dumps({'ok': True, "
            "'cvd': os.environ.get('CUDA_VISIBLE_DEVICES')}))")
CANARY = "import os; print('MISMATCH on', os.environ.get('CUDA_VISIBLE_DEVICES'))"
GPU_NODE = {gpu: name for name, gpus in NODES.items() for gpu in gpus}


def node_label(name: str) -> str:
    """How a run row names a node: every test node has this host's name, so the Ray node
    name is added (`hazards.engine.executors.ray_executor.node_labels`)."""
    return f"{HOST}/{name}"


def gpu_of(r) -> str:
    """The GPU a run row names: a command's is its lease's UUID, the fake server's the one it
    named itself after its CUDA_VISIBLE_DEVICES in its handshake (GPU-fake-<UUID>)."""
    return r.gpu_uuid.removeprefix("GPU-fake-")


SLOW_SERVER = f"""
[[target]]
name = "slowfam"
variant = "asleep"
kind = "server"
argv = [{json.dumps(PY)}, {json.dumps(str(FAKE_SERVER))}, "--handshake", "ok"]
params = {{ variant = "asleep", sleep_s = 600 }}
launches = 1
timeout = 4
expect = "detect"
"""


def targets_toml(path: Path, sleep_s: float, extra: str = "") -> Path:
    """A clean server item, a canary server item, a clean command and a canary command
    (and `extra` TOML)."""
    path.write_text(extra + f"""
[[target]]
name = "fakefam"
variant = "steady"
kind = "server"
argv = [{json.dumps(PY)}, {json.dumps(str(FAKE_SERVER))}]
params = {{ variant = "steady", sleep_s = {sleep_s} }}
launches = 10
timeout = 30

[[target]]
name = "fakefam"
variant = "broken"
kind = "server"
argv = [{json.dumps(PY)}, {json.dumps(str(FAKE_SERVER))}]
params = {{ variant = "broken", fail_prob = 1.0, sleep_s = {sleep_s} }}
launches = 10
timeout = 30
expect = "detect"

[[target]]
name = "cvd-command"
argv = [{json.dumps(PY)}, "-c", {json.dumps(CVD_LINE)}]
timeout = 30

[[target]]
name = "canary-command"
argv = [{json.dumps(PY)}, "-c", {json.dumps(CANARY)}]
result_regex = "MISMATCH"
timeout = 30
expect = "detect"
""")
    return path


class Driver:
    """`hazards soak --executor ray --address ...` in a process of its own (no node's)."""

    def __init__(self, tmp: Path, address: str) -> None:
        self.tmp, self.address = tmp, address
        self.store = tmp / "results.db"
        self.lease_dir = tmp / "driver-leases"  # the driver leases nothing: must stay empty
        self.env = ray_env(HZ_LEASE_DIR=str(self.lease_dir))

    def argv(self, *args: str) -> list[str]:
        return [PY, "-m", "hazards", "soak", "--executor", "ray", "--address", self.address,
                "--store", str(self.store), "--json", *args]

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), cwd=self.tmp, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run(self, *args: str, timeout: float = 180) -> tuple[int, dict, str]:
        proc = self.start(*args)
        out, err = proc.communicate(timeout=timeout)
        doc = json.loads(out) if out.strip().startswith("{") else {}
        return proc.returncode, doc, err

    def count_runs(self) -> int:
        """Runs committed so far (read while the driver writes: WAL)."""
        if not self.store.exists():
            return 0
        with sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=5) as db:
            try:
                return db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            except sqlite3.OperationalError:
                return 0

    def wait_runs(self, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.count_runs() < n:
            assert proc.poll() is None, f"driver exited early: {proc.communicate()}"
            assert time.monotonic() < deadline, f"fewer than {n} runs within {timeout}s"
            time.sleep(0.2)


def gpu_actor_processes() -> list[psutil.Process]:
    """Ray worker processes hosting a GpuActor (Ray titles them `ray::GpuActor...`)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any("GpuActor" in part for part in p.info["cmdline"] or []):
                out.append(p)
        except psutil.Error:
            continue
    return out


def target_processes(marker: str) -> list[psutil.Process]:
    """Target processes of these tests still alive (fake servers and commands)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if marker in cmd and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def wait_gone(find, timeout: float) -> float:
    """Seconds until `find()` returns nothing (AssertionError after `timeout`)."""
    t0 = time.monotonic()
    while find():
        assert time.monotonic() - t0 < timeout, f"still alive after {timeout}s: " \
            f"{[(p.pid, ' '.join(p.cmdline())[:120]) for p in find()]}"
        time.sleep(0.2)
    return time.monotonic() - t0


def test_soak_through_the_head_address_runs_on_every_node_and_streams_rows_to_the_driver(cluster, tmp_path):
    driver = Driver(tmp_path, cluster.address)
    rc, doc, err = driver.run("--targets", str(targets_toml(tmp_path / "targets.toml", 0.02)),
                              "--no-families", "--budget", "4s")
    assert rc == 0, (rc, doc, err)
    store = Store(driver.store, read_only=True)
    camp = store.campaign(doc["campaign"])
    assert camp.status == "complete" and camp.spec["executor"] == {"name": "ray", "address": cluster.address}
    runs = [sr.result for sr in store.runs(camp.id)]
    # Every row names the node and the GPU it ran on; each GPU is its own node's.
    assert {(r.host, gpu_of(r)) for r in runs} == {(node_label(GPU_NODE[g]), g) for g in GPU_NODE}
    # The children ran on the GPU their actor leased (Ray's CUDA_VISIBLE_DEVICES, a UUID).
    assert all(r.metrics["cvd"] == r.gpu_uuid for r in runs if r.target == "cvd-command")
    assert all(r.metrics["cvd"] == gpu_of(r) for r in runs if r.target == "fakefam")
    # Leases were taken on the node that ran the work, in that node's lease folder.
    for name, gpus in NODES.items():
        log = read_lease_log(cluster.nodes[name].lease_dir)
        assert {e["uuid"] for e in log if e["event"] == "acquire"} == set(gpus)
        assert {e["uuid"] for e in log if e["event"] == "release"} == set(gpus)
    assert not driver.lease_dir.exists()
    # The canary's artifacts (the command's output) came back into the driver's store folder.
    failing = [r for r in runs if r.target == "canary-command"]
    assert failing and all(r.outcome.value == "mismatch" for r in failing)
    for r in failing:
        folder = Path(r.artifact_dir)
        assert folder.is_relative_to(driver.store.parent)
        assert f"MISMATCH on {r.gpu_uuid}" in "".join(p.read_text() for p in folder.iterdir())
    per_gpu = {g["uuid"]: g["runs"] for g in doc["gpus"]}
    assert per_gpu == {g: sum(gpu_of(r) == g for r in runs) for g in GPU_NODE}
    print(f"\nmultinode soak: runs per GPU {per_gpu}")


def test_every_node_of_the_cluster_is_on_loopback_only(cluster):
    """Loopback only: no connection of any node's process leaves 127.0.0.1, and nothing listens on
    the machine's network interface (Ray's gRPC servers listen on the wildcard address, which
    sends nothing; a socket bound to a non-loopback address would mean a node took the
    interface's IP instead of 127.0.0.1)."""
    seen, off = 0, []
    for node in cluster.nodes.values():
        for proc in node.processes():
            try:
                conns = proc.net_connections(kind="inet")
            except psutil.Error:
                continue
            for c in conns:
                seen += 1
                local_ok = is_loopback_host(c.laddr.ip) or ipaddress.ip_address(c.laddr.ip).is_unspecified
                if not local_ok or (c.raddr and not is_loopback_host(c.raddr.ip)):
                    off.append((node.name, proc.name(), c.laddr, c.raddr, c.status))
    assert seen > 0  # the nodes' sockets were looked at
    assert off == [], f"sockets of the test cluster off loopback: {off}"


def test_driver_sigkill_leaves_no_actor_at_work_and_resume_continues(cluster, tmp_path):
    driver = Driver(tmp_path, cluster.address)
    # slowfam's requests sleep for ten minutes (a hang, killed after 4 s): the GPU that took
    # one is busy with it when the driver dies, its server process deaf to all but signals.
    targets = targets_toml(tmp_path / "targets.toml", 0.2, SLOW_SERVER)
    proc = driver.start("--targets", str(targets), "--no-families", "--budget", "10s")
    driver.wait_runs(4, proc)
    assert gpu_actor_processes() and target_processes(str(FAKE_SERVER))
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    killed_after = driver.count_runs()
    actors_gone_s = wait_gone(gpu_actor_processes, 60)
    targets_gone_s = wait_gone(lambda: target_processes(str(FAKE_SERVER)), 30)
    store = Store(driver.store, read_only=True)
    cid = store.campaigns("soak")[-1].id
    assert store.campaign(cid).status == "running"  # its driver died: resumable
    store.close()

    rc, doc, err = driver.run("--resume", str(cid))
    assert rc == 0, (rc, doc, err)
    store = Store(driver.store, read_only=True)
    camp = store.campaign(cid)
    seqs = [sr.seq for sr in store.runs(cid)]
    assert camp.status == "complete" and len(camp.spec["sessions"]) == 2
    # The runs in flight when the driver died never reached the store (their numbers stay
    # unused); the new session numbers its runs after the last stored one.
    assert seqs == sorted(set(seqs)) and len(seqs) > killed_after
    assert doc["spent_s"] >= 0.9 * doc["budget_s"]
    print(f"\ndriver SIGKILL: {killed_after} runs stored before; actors gone after {actors_gone_s:.1f}s, "
          f"their targets after {targets_gone_s:.1f}s more; resume: {len(seqs)} runs, status {camp.status}")


def test_node_loss_mid_soak_is_an_infrastructure_error_and_the_other_nodes_finish(cluster, tmp_path):
    driver = Driver(tmp_path, cluster.address)
    targets = targets_toml(tmp_path / "targets.toml", 0.5)  # every request in flight for 0.5 s
    budget = 12.0
    proc = driver.start("--targets", str(targets), "--no-families", "--budget", f"{budget:g}s")
    driver.wait_runs(6, proc)
    killed = cluster.nodes["node-a"].kill()
    killed_at = time.time()  # every process of node-a is dead by now (a request may start while they die)
    out, err = proc.communicate(timeout=180)
    rc, doc = proc.returncode, json.loads(out)
    assert rc == 5, (rc, out[-2000:], err[-2000:])  # degraded, not a hazard (1) nor bad input (2)

    store = Store(driver.store, read_only=True)
    camp = store.campaign(doc["campaign"])
    runs = store.runs(camp.id)
    lost = [sr.result for sr in runs if sr.result.error_kind == "node_lost"]
    assert len(lost) == 1
    run = lost[0]
    assert run.outcome.value == "error" and run.reason.startswith(f"node lost: {node_label('node-a')}")
    assert run.host == node_label("node-a") and gpu_of(run) == "GPU-a0"
    assert run.started_at < killed_at  # it was in flight when the node died
    # Nothing on the surviving nodes was lost or mistaken: numbering has no gap, every
    # failure is a canary's, and node-b's GPUs ran to the end of the budget.
    assert [sr.seq for sr in runs] == list(range(1, len(runs) + 1))
    assert {sr.result.key for sr in runs if sr.result.outcome.is_failure} <= {"fakefam/broken", "canary-command"}
    assert all(sr.result.outcome.value != "error" for sr in runs if sr.result is not run)
    after = [sr.result for sr in runs if sr.result.started_at > killed_at + 1]
    assert {gpu_of(r) for r in after} == {"GPU-b0", "GPU-b1"}
    ends = max(r.started_at + r.duration_s for r in after)
    session = camp.spec["sessions"][0]["started"]
    assert ends - session >= 0.8 * budget
    # The report says which node was lost, when, and what it cost.
    (loss,) = doc["lost"]
    assert loss["node"] == node_label("node-a") and loss["gpus"] == ["GPU-a0"] and loss["of_gpus"] == 3
    assert abs(loss["at"] - killed_at) < 10 and 0 < loss["share"] < 1 / 3
    assert camp.spec["lost"] == doc["lost"] and loss["note"] in camp.spec["notes"]
    assert loss["note"] in doc["report"]["notes"]  # the report shows it
    assert not cluster.nodes["node-a"].processes()
    print(f"\nnode loss: killed {len(killed)} processes of node-a at +{killed_at - session:.1f}s; "
          f"recorded {loss['at'] - killed_at:.2f}s later; capacity lost {loss['gpu_s_lost']:.1f} GPU-s "
          f"= {loss['share']:.0%}; runs per GPU {({g['uuid']: g['runs'] for g in doc['gpus']})}; exit {rc}")
