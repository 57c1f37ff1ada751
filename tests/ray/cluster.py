"""A real multi-node Ray cluster on one machine, for the multi-host soak tests.

Each node is its own `ray start --block` process in a session of its own (so it and every
process it starts, raylet and workers included, form one process group we can kill as a
host dies), with its own environment as a different host would have: its fake GPUs
($HZ_FAKE_GPUS, with CUDA_VISIBLE_DEVICES listing them the way a host restricts its
raylet), its own lease folder ($HZ_LEASE_DIR) and its own node name. Every node is on
127.0.0.1 (`--node-ip-address`, the head's dashboard off): the cluster's traffic stays on
the loopback interface, as every test's must. The head node has
no GPU, so the driver (which attaches to a raylet of its own host: the head, here) never
shares a node with the work.

Nothing here uses `ray stop`: it kills every Ray process of the machine, other users'
clusters included. `stop()` ends exactly the processes this cluster started, and
`survivors()` lists any process still carrying the cluster's temporary folder, which
`stop()` removes once none is left.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import psutil

REPO = Path(__file__).resolve().parents[2]
STARTED_LINE = "Ray runtime started."
# node name -> its fake GPUs (UUIDs, listed in the node's CUDA_VISIBLE_DEVICES as a host
# restricting its raylet would; Ray hands one to each actor as its CUDA_VISIBLE_DEVICES)
NODES = {"node-a": ["GPU-a0"], "node-b": ["GPU-b0", "GPU-b1"]}
START_TIMEOUT_S = 240.0
NO_RAY = "Ray is an optional extra: pip install \"gpu-hazards[ray]\""  # a 2-core CI machine under load: measured 15-60 s per node
LOOPBACK = "127.0.0.1"  # every node, driver and fake head of the tests binds here and talks to nothing else
# `ray ...` with 127.0.0.1 kept as given (Ray on Linux would swap it for the outbound
# interface's address: hazards.engine.executors.ray_executor.loopback_kept).
RAY_CLI_ON_LOOPBACK = ("import sys\nfrom hazards.engine.executors.ray_executor import loopback_kept\n"
                       "from ray.scripts.scripts import main\nwith loopback_kept():\n    sys.exit(main())")


def have_ray() -> bool:
    """Whether Ray imports here (a test that needs it skips with NO_RAY otherwise)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def free_port() -> int:
    """A port of 127.0.0.1 where nothing listens (a connection to it is refused)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


# What an HTTP/2 server that is not gRPC (a web server, a transparent proxy) answers: its
# SETTINGS, then a response to stream 1 with ":status: 404" (HPACK static entry 13).
HTTP2_NOT_FOUND = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]) + bytes([0, 0, 1, 1, 5, 0, 0, 0, 1, 0x8D])
GARBAGE = b"SSH-2.0-not-a-ray-head\r\n"  # a service that speaks first, then hangs up


@contextlib.contextmanager
def fake_head(answer: bytes = b"", hang_up: bool = False) -> Iterator[str]:
    """A port of 127.0.0.1 (its address yielded) where something accepts every connection
    and sends `answer` (b"": stays silent), then ends its side of it if `hang_up`."""
    srv = socket.socket()
    srv.bind((LOOPBACK, 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = srv.accept()[0]
            except OSError:
                continue
            if answer:
                conn.sendall(answer)
            if hang_up:  # a FIN, not a close: a close with our request unread would be a reset
                conn.shutdown(socket.SHUT_WR)
            held.append(conn)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"{LOOPBACK}:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
        srv.close()


@contextlib.contextmanager
def full_backlog() -> Iterator[str]:
    """A port of 127.0.0.1 (its address yielded) that listens but never accepts, its
    accept queue already full: Linux drops a new connection's SYN, so a connect gets no
    answer at all until its own timeout (as a host that drops packets would)."""
    srv = socket.socket()
    srv.bind((LOOPBACK, 0))
    srv.listen(0)  # the queue holds one connection
    filler = socket.create_connection(srv.getsockname(), timeout=5)
    try:
        yield f"{LOOPBACK}:{srv.getsockname()[1]}"
    finally:
        filler.close()
        srv.close()


def ray_env(**extra: str) -> dict[str, str]:
    """The environment of a node or a driver of the test cluster: our checkout importable,
    no GPU or lease setting of the calling test, Ray's token auth and usage stats off (a
    private cluster on the loopback interface)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HZ_", "RAY_", "PYTEST_")) and k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    env.update(PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


@dataclasses.dataclass
class Node:
    """One `ray start --block` process (RAY_CLI_ON_LOOPBACK) and what it was given."""

    name: str
    gpus: list[str]
    lease_dir: Path | None
    proc: subprocess.Popen
    log: Path
    started_s: float = 0.0  # seconds from start to "Ray runtime started."

    def processes(self) -> list[psutil.Process]:
        """The node's processes: its process group (raylet, agents, workers) and every
        descendant, target processes in sessions of their own included."""
        found: dict[int, psutil.Process] = {}
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == self.proc.pid:
                    found[p.pid] = p
            except (ProcessLookupError, psutil.Error):
                continue
        for p in list(found.values()):
            try:
                for c in p.children(recursive=True):
                    found[c.pid] = c
            except psutil.Error:
                pass
        return list(found.values())

    def kill(self) -> list[int]:
        """SIGKILL the node as a host dies: every process of it at once. The pids killed."""
        procs = self.processes()
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return sorted(p.pid for p in procs)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class LocalCluster:
    """A head (no GPU) plus worker nodes with fake GPUs, all on this machine."""

    def __init__(self) -> None:
        # Short: Ray's unix sockets live under it (108-byte path limit).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="hzray-", dir="/tmp"))
        self.port = free_port()
        self.address = f"{LOOPBACK}:{self.port}"
        self.nodes: dict[str, Node] = {}

    def _start(self, name: str, args: list[str], gpus: list[str], lease_dir: Path | None,
               env: dict[str, str]) -> Node:
        log = self.temp_dir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-c", RAY_CLI_ON_LOOPBACK, "start", *args, "--block",
                                     "--disable-usage-stats",
                                     f"--node-ip-address={LOOPBACK}", f"--node-name={name}",
                                     f"--temp-dir={self.temp_dir}"],
                                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        node = Node(name, gpus, lease_dir, proc, log)
        self.nodes[name] = node
        return node

    def start_head(self) -> Node:
        return self._start("head", ["--head", f"--port={self.port}", "--num-cpus=1", "--num-gpus=0",
                                    "--include-dashboard=false", "--include-log-monitor=false"], [], None, ray_env())

    def start_worker(self, name: str, gpus: list[str]) -> Node:
        lease_dir = self.temp_dir / f"leases-{name}"
        env = ray_env(HZ_FAKE_GPUS=",".join(gpus), CUDA_VISIBLE_DEVICES=",".join(gpus),
                      HZ_LEASE_DIR=str(lease_dir))
        return self._start(name, [f"--address={self.address}", "--num-cpus=0", f"--num-gpus={len(gpus)}",
                                  "--dashboard-agent-listen-port=0", "--metrics-export-port=0",
                                  "--include-log-monitor=false"],
                           gpus, lease_dir, env)

    def wait_started(self, nodes: list[Node], t0: float, timeout: float = START_TIMEOUT_S) -> None:
        """Until every node printed that its runtime started (RuntimeError if one died)."""
        deadline = time.monotonic() + timeout
        waiting = list(nodes)
        while waiting:
            for node in list(waiting):
                text = node.log.read_text(errors="replace") if node.log.exists() else ""
                if STARTED_LINE in text:
                    node.started_s = time.monotonic() - t0
                    waiting.remove(node)
                elif not node.alive:
                    raise RuntimeError(f"ray node {node.name} exited {node.proc.returncode}:\n{text[-3000:]}")
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"ray nodes {[n.name for n in waiting]} did not start within {timeout:g}s")
            time.sleep(0.2)

    def survivors(self) -> list[tuple[int, str]]:
        """(pid, command line) of every process that still names this cluster's folder or
        belongs to one of its nodes' process groups."""
        marker = str(self.temp_dir)
        pgids = {n.proc.pid for n in self.nodes.values()}
        out = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                if marker in cmd or os.getpgid(p.pid) in pgids:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        out.append((p.pid, cmd[:200]))
            except (ProcessLookupError, psutil.Error):
                continue
        return out

    def stop(self, grace_s: float = 15.0) -> list[tuple[int, str]]:
        """End every node: SIGTERM to each `ray start --block` (it stops its own processes),
        then SIGKILL to whatever of its process group is left. Returns the survivors (none)."""
        workers = [n for n in self.nodes.values() if n.name != "head"]
        head = [n for n in self.nodes.values() if n.name == "head"]
        for group in (workers, head):
            for node in group:
                if node.alive:
                    node.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for node in group:
                try:
                    node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                node.kill()
        deadline = time.monotonic() + 10
        while self.survivors() and time.monotonic() < deadline:
            for pid, _ in self.survivors():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        left = self.survivors()
        if not left:  # the Ray session, the nodes' logs and lease folders
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left


def start_cluster(workers: dict[str, list[str]]) -> LocalCluster:
    """A head and the named worker nodes ({name: fake GPU UUIDs}), all started."""
    cluster = LocalCluster()
    try:
        t0 = time.monotonic()
        head = cluster.start_head()
        cluster.wait_started([head], t0)
        for name, gpus in workers.items():  # one at a time: nodes of one IP starting together
            cluster.wait_started([cluster.start_worker(name, gpus)], t0)  # time out looking for their raylet
    except BaseException:
        cluster.stop()
        raise
    return cluster


if __name__ == "__main__":  # manual experiments: python3 tests/ray/cluster.py; stop with SIGTERM/Ctrl-C
    c = start_cluster(NODES)
    print({n.name: round(n.started_s, 1) for n in c.nodes.values()}, c.address, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        print("survivors:", c.stop(), flush=True)
