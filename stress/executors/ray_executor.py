"""The Ray executor: one actor per GPU of a Ray cluster hosts that GPU's side of the loop.

`hazards soak --executor ray [--address HEAD]` spreads a soak over every GPU of a Ray
cluster: an existing one (`--address HOST:PORT` of its head, or `ray://HOST:PORT` through
Ray Client), or a local one started here when no address is given. Per GPU there is one
`GpuActor` (`num_gpus=1`, so Ray sets its CUDA_VISIBLE_DEVICES), created with
`max_restarts=0` and `max_task_retries=0`: a retried run would hide a hang or a crash.
More in docs/campaigns.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from ..errors import UserError
from ..loop import GpuLost, GpuStats, WorkItem, default_target_factory, run_local
from ..leases import GpuLease
from ..outcome import HOST, Outcome, RunResult
from ..targets.base import Target, run_kw

STARTUP_TIMEOUT_S = 120.0   # actors created, leases taken, first call answered
ANSWER_MARGIN_S = 60.0      # beyond a run's own timeout + kill grace + hang collectors
CLOSE_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 5.0       # connecting to the head: Ray itself would retry for minutes
ARTIFACT_COPY_MAX_BYTES = 64 << 20  # per run: what a run leaves beyond it stays on its node
LOOPBACK = "127.0.0.1"      # the node IP of the local cluster `RayExecutor` starts
NODE_LOST = "node_lost"     # error_kind of the run in flight on a GPU whose node was lost

# The probe speaks just enough HTTP/2 to make one gRPC call (see `grpc_answers`).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_H2_DATA, _H2_HEADERS, _H2_RST_STREAM, _H2_SETTINGS, _H2_GOAWAY = 0, 1, 3, 4, 7
_H2_END_STREAM, _H2_ACK, _H2_END_HEADERS = 1, 1, 4
_HPACK_STATUS_200 = 0x88        # HPACK static table entry 8, ":status: 200"
_GCS_CHECK_ALIVE = "/ray.rpc.NodeInfoGcsService/CheckAlive"


def import_ray() -> Any:
    """The `ray` module, or a UserError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("the Ray executor needs Ray: pip install \"gpu-hazards[ray]\"") from None
    return ray


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of a Ray address `HOST:PORT`, `[IPv6]:PORT` or `ray://HOST:PORT`;
    UserError for anything else."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"Ray address {address!r} is not HOST:PORT (the head's GCS port, 6379 by default, "
                        "or ray://HOST:PORT for Ray Client)")
    return host, int(port)


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _hpack_literal(name: str, value: str) -> bytes:
    """A header field as an HPACK literal without indexing, no Huffman (short strings only)."""
    n, v = name.encode(), value.encode()
    return bytes([0, len(n)]) + n + bytes([len(v)]) + v


def grpc_answers(sock: socket.socket, authority: str, path: str = _GCS_CHECK_ALIVE) -> str | None:
    """Make one gRPC call with an empty request on a connected socket; None when a gRPC
    server answered it (HTTP status 200, with a reply or an error status of its own, as a
    Ray head without token authentication or with it does), else what came back instead.

    Ray's own connect retries for minutes at anything that accepts the connection, a
    transparent HTTP proxy included (one answers every port with an HTTP/2 error page)."""
    headers = b"".join(_hpack_literal(k, v) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
        ("content-type", "application/grpc"), ("te", "trailers")))
    deadline = time.monotonic() + (sock.gettimeout() or PROBE_TIMEOUT_S)
    try:
        sock.sendall(_H2_PREFACE + _h2_frame(_H2_SETTINGS, 0, 0)
                     + _h2_frame(_H2_HEADERS, _H2_END_HEADERS, 1, headers)
                     + _h2_frame(_H2_DATA, _H2_END_STREAM, 1, bytes(5)))  # an empty gRPC message
        buf = b""
        while True:
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                size, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                stream, payload, buf = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + size], buf[9 + size:]
                if kind == _H2_SETTINGS and not flags & _H2_ACK:
                    sock.sendall(_h2_frame(_H2_SETTINGS, _H2_ACK, 0))
                elif kind == _H2_HEADERS and stream == 1:
                    return None if payload[:1] == bytes([_HPACK_STATUS_200]) else "an HTTP answer that is not gRPC"
                elif kind in (_H2_RST_STREAM, _H2_GOAWAY):
                    return "the call was refused"
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = sock.recv(65536)
            if not data:
                return "the connection was closed"
            buf += data
    except socket.timeout:
        return "no answer to a gRPC call"
    except OSError as e:
        return e.strerror or type(e).__name__


@contextlib.contextmanager
def loopback_kept() -> Iterator[None]:
    """While open, Ray keeps a loopback host (127.0.0.1, localhost) as given.

    Ray 2.x on Linux replaces a loopback `--node-ip-address`, `_node_ip_address` or join
    address by the address of the machine's outbound interface
    (`ray._private.services.resolve_ip_for_localhost`), which moves a cluster meant for
    this machine alone onto its network interface. Other hosts are resolved as Ray does.
    Without that private function (another Ray version) this changes nothing."""
    try:
        from ray._private import services
    except ImportError:
        yield
        return
    real = getattr(services, "resolve_ip_for_localhost", None)
    if real is None:
        yield
        return

    def keep_loopback(host: str) -> str:
        return host if host and is_loopback_host(host) else real(host)

    services.resolve_ip_for_localhost = keep_loopback
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = real


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_loopback_host(host: str | None) -> bool:
    """Whether `host` (an IP literal or a name) is this machine's loopback, without asking a
    resolver: 127.0.0.0/8, ::1, ::ffff:127.x or one of LOOPBACK_NAMES. None is not."""
    if not host:
        return False
    host = host.strip("[]").split("%")[0].lower().rstrip(".")
    if host in LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def probe_address(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """UserError (one line) unless a gRPC server answers at `address` within `timeout`.

    Ray's own connect retries for minutes when nothing is there; this tells a typo, a
    head that is down, and a port that is not a Ray head's apart in seconds: it connects,
    then calls the GCS's CheckAlive (a Ray Client server, `ray://`, answers it with an
    error status, which counts: a gRPC server is there). With Ray's TLS on (RAY_USE_TLS=1)
    only the TCP connection is checked."""
    host, port = split_address(address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"cannot reach the Ray head at {address}: unknown host {host!r} ({e.strerror})") from None
    last: OSError | None = None
    for family, kind, proto, _, where in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(where)
            except OSError as e:
                last = e
                continue
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            why = grpc_answers(sock, f"{host}:{port}")
            if why is None:
                return
            raise UserError(f"{address} is not a Ray head: something listens there but does not answer gRPC "
                            f"({why}); give the head's GCS port, 6379 by default, or ray://HOST:PORT for Ray Client")
    why = f"no answer within {timeout:g}s" if isinstance(last, socket.timeout) else \
        (getattr(last, "strerror", None) or str(last))
    raise UserError(f"cannot reach the Ray head at {address}: {why} "
                    "(is the cluster up? `ray status --address ADDRESS` on a node tells)")


def _take_artifacts(folder: Path, limit: int = ARTIFACT_COPY_MAX_BYTES) -> tuple[dict[str, bytes], list[dict]]:
    """The files of a run's folder on this node, smallest first, up to `limit` bytes in all
    ({relative path: content}, removed here), and those left behind ([{path, bytes}])."""
    if not folder.is_dir():
        return {}, []
    files = sorted((p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()),
                   key=lambda p: p.stat().st_size)
    taken: dict[str, bytes] = {}
    left: list[dict] = []
    total = 0
    for p in files:
        size = p.stat().st_size
        if total + size > limit:
            left.append({"path": str(p), "bytes": size})
            continue
        try:
            taken[p.relative_to(folder).as_posix()] = p.read_bytes()
        except OSError as e:
            left.append({"path": str(p), "bytes": size, "error": str(e)})
            continue
        total += size
        p.unlink()
    if not left:
        shutil.rmtree(folder, ignore_errors=True)
    return taken, left


def _put_artifacts(folder: Path, files: dict[str, bytes]) -> None:
    """Write files sent back by an actor into the run's folder on the driver."""
    for rel, data in files.items():
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            continue  # only ever below the run's folder
        dest = folder.joinpath(*parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


class GpuActor:
    """Lives in a Ray actor with one GPU (Ray set its CUDA_VISIBLE_DEVICES). Plain class;
    `RayExecutor` wraps it with `ray.remote`. `session` names the driver's session: this
    node's artifact folders live under `<temp dir>/gpu-hazards-ray/<session>/`."""

    def __init__(self, holder: str, lock_dir: str | None = None, exclusive: bool = False,
                 telemetry: bool = True, session: str = "session") -> None:
        from ..leases import acquire_free

        got, refused = acquire_free(holder, lock_dir=lock_dir, max_gpus=1, exclusive=exclusive)
        if not got:
            why = "; ".join(refused.values()) or "no GPU visible (CUDA_VISIBLE_DEVICES=" \
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
            raise UserError(f"Ray actor on {os.uname().nodename} could not lease its GPU: {why}")
        self.lease = got[0]
        self.targets: dict[tuple, Any] = {}
        self.scratch = Path(tempfile.gettempdir()) / "gpu-hazards-ray" / session
        self.monitor = None
        if telemetry:
            from ..telemetry import TelemetryMonitor

            self.monitor = TelemetryMonitor([self.lease.uuid]).start()

    def describe(self) -> dict[str, Any]:
        """The lease this actor holds and the node it runs on, for the driver's pseudo-lease."""
        import ray

        return {**self.lease.info(), "lock_path": str(self.lease.lock_path),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "hostname": HOST, "node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address(), "actor_pid": os.getpid()}

    def _target(self, item: WorkItem) -> Any:
        key = item.target_key
        if key not in self.targets:
            self.targets[key] = default_target_factory(item, {**item.env, **self.lease.env()})
        return self.targets[key]

    def run(self, item_json: dict[str, Any], params: dict[str, Any], timeout: float, launches: int | None,
            artifact_dir: str | None) -> dict[str, Any]:
        """One run of `item` on this GPU: {"result": RunResult as JSON (telemetry in its
        evidence), "artifacts": {relative path: bytes} of its folder, "left": files too
        big to send, left on this node}. `artifact_dir` is the driver's folder for the
        run; here the run gets a folder of the same name in this node's scratch folder."""
        item = WorkItem.from_json(item_json)
        local = self.scratch / Path(artifact_dir).parent.name / Path(artifact_dir).name if artifact_dir else None
        window = self.monitor.begin(self.lease.uuid) if self.monitor else None
        result = self._target(item).run(params, timeout=timeout, launches=launches, artifact_dir=local,
                                        **run_kw(item.stall_s))
        if window is not None:
            tel = self.monitor.end(window)
            if tel:
                result.evidence = {**(result.evidence or {}), "telemetry": {**tel, "host": self.lease.host}}
        result.gpu_uuid = result.gpu_uuid or self.lease.uuid
        files, left = _take_artifacts(local) if local is not None else ({}, [])
        return {"result": result.to_json(), "artifacts": files, "left": left}

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
        for folder in sorted(self.scratch.rglob("*"), reverse=True) + [self.scratch]:
            try:
                folder.rmdir()  # empty folders only: files left on purpose stay
            except OSError:
                pass
        return summary


@dataclasses.dataclass
class RemoteGpu:
    """What the driver knows of one actor's GPU: where it is and its handle."""

    actor: Any
    node: str       # the node's label in run rows: its host name (+ Ray node name where hosts repeat)
    node_id: str    # Ray's node id
    gpu: str        # the CUDA_VISIBLE_DEVICES entry the actor leased on its node
    uuid: str | None
    lost: bool = False


class RemoteTarget(Target):
    """Driver-side stand-in for a target that lives in a GPU actor."""

    def __init__(self, executor: "RayExecutor", label: str, item: WorkItem) -> None:
        self.executor, self.label, self.item = executor, label, item
        self.remote = executor.gpus[label]
        self.name = item.target

    def run(self, params: dict[str, Any] | None = None, *, timeout: float, launches: int | None = None,
            artifact_dir: Path | None = None, stall: float | None = None,
            cutoff: float | None = None) -> RunResult:
        """`stall` travels in the item (the actor reads `item.stall_s`); `cutoff` does not
        (another host's clock): a remote run ends by its own timeout or stall."""
        ray = self.executor.ray
        started = time.time()
        limit = timeout + self.executor.answer_margin_s
        try:
            item = self.item if stall == self.item.stall_s else dataclasses.replace(self.item, stall_s=stall)
            ref = self.remote.actor.run.remote(item.to_json(), dict(params or {}), timeout, launches,
                                               str(artifact_dir) if artifact_dir else None)
            reply = ray.get(ref, timeout=limit)
        except ray.exceptions.GetTimeoutError:
            why = f"its GPU actor did not answer within {limit:g}s (run timeout {timeout:g}s)"
        except ray.exceptions.RayActorError as e:  # died, or unreachable (ActorUnavailableError)
            why = f"its GPU actor is gone ({type(e).__name__}: {str(e).strip().splitlines()[0][:300]})"
        except ray.exceptions.RayTaskError as e:  # the run itself raised (e.g. a target that cannot start)
            cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else None
            raise (cause or RuntimeError(str(e))) from None
        else:
            result = RunResult.from_json(reply["result"])
            result.host = self.remote.node
            made = result.artifact_dir is not None or reply["artifacts"]  # the node's folder existed
            result.artifact_dir = None
            if artifact_dir is not None and made:  # the same folder here, what it held copied back
                artifact_dir.mkdir(parents=True, exist_ok=True)
                _put_artifacts(artifact_dir, reply["artifacts"])
                result.artifact_dir = str(artifact_dir)
            if reply["left"]:
                result.evidence = {**(result.evidence or {}),
                                   "left_on_node": {"node": self.remote.node, "files": reply["left"]}}
            return result
        raise GpuLost(self.executor.lose(self.label, why, started, self.item))

    def close(self) -> None:
        if self.remote.lost:
            return
        try:
            self.executor.ray.get(self.remote.actor.close_target.remote(self.item.to_json()),
                                  timeout=CLOSE_TIMEOUT_S)
        except Exception:
            pass  # a dead actor's process tree died with it; shutdown() reports the rest


def node_labels(infos: list[dict[str, Any]], node_names: dict[str, str]) -> dict[str, str]:
    """{Ray node id: label}: the host name, or `host/<Ray node name>` (else `host/<node id>`)
    where several nodes share a host name (nodes in containers, or a test cluster)."""
    ids_by_host: dict[str, set[str]] = {}
    for info in infos:
        ids_by_host.setdefault(info["hostname"], set()).add(info["node_id"])
    labels = {}
    for host, ids in ids_by_host.items():
        if len(ids) == 1:
            labels[next(iter(ids))] = host
            continue
        names = {nid: node_names.get(nid) or nid[:12] for nid in ids}
        unique = len(set(names.values())) == len(ids)
        for nid in ids:
            labels[nid] = f"{host}/{names[nid] if unique else nid[:12]}"
    return labels


class RayExecutor:
    """Start (or join) a Ray cluster and one GpuActor per GPU; a context manager.

    `leases` (one pseudo-lease per actor) and `target_factory` plug into `run_local` /
    `run_soak` exactly like local leases do. `address=None` starts a local Ray instance;
    `init_kwargs` go to `ray.init` (e.g. `num_gpus=2, num_cpus=2` for a test cluster).
    `lost` lists the GPUs lost during the run (see `lose`).
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
        self.gpus: dict[str, RemoteGpu] = {}  # pseudo-lease visible_devices -> the actor's GPU
        self.leases: list[GpuLease] = []
        self.telemetry_summary: dict[str, Any] = {}
        self.lost: list[dict[str, Any]] = []
        self._mu = threading.Lock()
        self._started_ray = False
        self.session = f"{HOST}-{os.getpid()}-{int(time.time())}"

    def __enter__(self) -> "RayExecutor":
        # Ray prints what its cluster reports (a raylet that died, ...) on sys.stdout, which
        # is the command's own (`--json`): while the executor is open it goes to stderr.
        self._stdout = contextlib.redirect_stdout(sys.stderr)
        self._stdout.__enter__()
        try:
            self.open()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            self._stdout.__exit__(None, None, None)

    def _init(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        kwargs = {"log_to_driver": False, "logging_level": "ERROR", **self.init_kwargs}
        if self.address is None:  # a local cluster: workers import this checkout like the driver does
            from ..leases import FAKE_ENV, fake_gpus

            kwargs.setdefault("include_dashboard", False)
            # It serves this machine only: on loopback, nothing of it is reachable from (or
            # talks to) the network, and it does not depend on which interface Ray guesses.
            kwargs.setdefault("_node_ip_address", LOOPBACK)
            root = str(Path(__file__).resolve().parents[2])
            env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
            fakes = fake_gpus()
            if fakes is not None:  # tests: the local cluster gets the fake GPUs as its GPU resources
                env[FAKE_ENV] = os.environ[FAKE_ENV]
                kwargs.setdefault("num_gpus", len(fakes))
            kwargs.setdefault("runtime_env", {"env_vars": env})
        elif self.address not in ("auto", "local"):
            probe_address(self.address)
        try:
            with loopback_kept():  # a cluster on 127.0.0.1 (ours, or --address 127.0.0.1:P) stays there
                ray.init(address=self.address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
            raise UserError(f"cannot start or reach the Ray cluster{f' at {self.address}' if self.address else ''}: "
                            f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
        self._started_ray = True

    def open(self) -> None:
        """Create one actor per GPU of the cluster (at most `max_gpus`) and read their leases."""
        self._init()
        ray = self.ray
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if self.max_gpus is not None:
            gpus = min(gpus, self.max_gpus)
        if gpus < 1:
            raise UserError(f"the Ray cluster{f' at {self.address}' if self.address else ''} has no GPU resources")
        actor_cls = ray.remote(GpuActor).options(num_gpus=1, num_cpus=0, max_restarts=0, max_task_retries=0)
        actors = [actor_cls.remote(f"ray soak actor {i}", self.lock_dir, self.exclusive, self.telemetry,
                                   self.session) for i in range(gpus)]
        try:
            infos = ray.get([a.describe.remote() for a in actors], timeout=STARTUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self._kill(actors)
            raise UserError(f"Ray GPU actors did not start within {STARTUP_TIMEOUT_S:g}s "
                            "(not enough free GPUs in the cluster?)") from None
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
            self._kill(actors)
            raise UserError(f"a Ray GPU actor failed to start: {str(e).strip().splitlines()[-1]}") from None
        names = {n["NodeID"]: n.get("NodeName", "") for n in ray.nodes()}
        labels = node_labels(infos, names)
        for actor, info in zip(actors, infos):
            node = labels[info["node_id"]]
            lease = GpuLease(gpu=f"{node}:{info['gpu']}", uuid=info["uuid"], holder=info["holder"],
                             lock_path=Path(info["lock_path"]), pid=info["pid"], host=node,
                             acquired_at=info["acquired_at"])
            self.gpus[lease.visible_devices] = RemoteGpu(actor, node, info["node_id"], info["gpu"], info["uuid"])
            self.leases.append(lease)

    def target_factory(self, item: WorkItem, env: dict[str, str]) -> RemoteTarget:
        """`hazards.engine.loop.TargetFactory` for the driver's loops: the pseudo-lease's
        CUDA_VISIBLE_DEVICES in `env` names the actor that runs the target."""
        return RemoteTarget(self, env["CUDA_VISIBLE_DEVICES"], item)

    def lose(self, label: str, why: str, started_at: float, item: WorkItem) -> RunResult:
        """Give up on the GPU `label` (its actor is killed, never restarted) and return the
        `error` run of the request it had in flight (kind NODE_LOST)."""
        remote = self.gpus[label]
        remote.lost = True
        self._kill([remote.actor])
        at = time.time()
        record = {"node": remote.node, "node_id": remote.node_id, "gpu": remote.gpu, "uuid": remote.uuid,
                  "at": at, "reason": why, "item": item.key}
        with self._mu:
            self.lost.append(record)
        return RunResult(Outcome.ERROR, f"node lost: {remote.node} (GPU {remote.uuid or remote.gpu}): {why}; "
                         "the run was not retried", target=item.target, variant=item.variant,
                         evidence={"node_lost": record}, started_at=started_at, duration_s=at - started_at,
                         host=remote.node, gpu_uuid=remote.uuid, error_kind=NODE_LOST)

    def _kill(self, actors: list[Any]) -> None:
        for actor in actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass

    def close(self) -> None:
        """Shut every actor down (targets closed, leases released), then Ray if we started it."""
        ray = self.ray
        refs = {label: g.actor.shutdown.remote() for label, g in self.gpus.items() if not g.lost}
        for label, ref in refs.items():
            try:
                self.telemetry_summary.update(ray.get(ref, timeout=CLOSE_TIMEOUT_S) or {})
            except Exception:
                pass  # a lost actor: its host's OS dropped the lease with the process
        self._kill([g.actor for g in self.gpus.values()])
        self.gpus.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def run_ray(executor: RayExecutor, source: Any, sink: Any, *, budget_s: float) -> list[GpuStats]:
    """`run_local` over the executor's actors: one driver-side GpuLoop per remote GPU."""
    return run_local(executor.leases, source, sink, budget_s=budget_s, target_factory=executor.target_factory)


def capacity_lost(lost: list[dict[str, Any]], gpus: int, started: float, planned_s: float) -> list[dict[str, Any]]:
    """The losses of one session grouped by node, each with the GPU time it cost: from the
    loss to the session's planned end, per GPU, and as a share of the session's GPU time."""
    end = started + planned_s
    nodes: dict[str, dict[str, Any]] = {}
    for rec in sorted(lost, key=lambda r: r["at"]):
        n = nodes.setdefault(rec["node"], {"node": rec["node"], "node_id": rec["node_id"], "at": rec["at"],
                                           "after_s": round(rec["at"] - started, 3), "gpus": [], "reasons": [],
                                           "items": [], "gpu_s_lost": 0.0})
        n["gpus"].append(rec["uuid"] or rec["gpu"])
        n["reasons"].append(rec["reason"])
        n["items"].append(rec["item"])
        n["gpu_s_lost"] += max(0.0, end - rec["at"])
    total = gpus * planned_s
    for n in nodes.values():
        n["gpu_s_lost"] = round(n["gpu_s_lost"], 3)
        n["share"] = n["gpu_s_lost"] / total if total > 0 else 0.0
        n["of_gpus"] = gpus
        n["note"] = loss_note(n)
    return list(nodes.values())


def loss_note(n: dict[str, Any]) -> str:
    """One line for the report: which node was lost, when, and what it cost."""
    when = time.strftime("%H:%M:%S", time.localtime(n["at"]))
    return (f"node lost: {n['node']} at {when} ({n['after_s']:.0f} s into the session), "
            f"{len(n['gpus'])} of {n['of_gpus']} GPUs ({', '.join(n['gpus'])}): {n['gpu_s_lost']:.0f} GPU-seconds, "
            f"{n['share']:.0%} of the session's GPU time; the run in flight is an error, not retried")


def run_soak_ray(store: Any, items: list[WorkItem] | None, *, budget_s: float, resume: int | None = None,
                 name: str | None = None, address: str | None = None, max_gpus: int | None = None,
                 lock_dir: str | None = None, exclusive: bool = False, init_kwargs: dict[str, Any] | None = None,
                 telemetry: bool = True, allocation: str = "evidence", observer: Any = None) -> Any:
    """`hazards.engine.soak.run_soak` on a Ray cluster; the SoakResult, with `lost` (the
    nodes lost in this session and what they cost) also in the campaign spec."""
    from ..campaign import INTERRUPTED, LeasedCampaign
    from ..soak import run_soak, spent_seconds

    spec_extra = {"executor": {"name": "ray", "address": address}}
    with RayExecutor(address=address, max_gpus=max_gpus, lock_dir=lock_dir, exclusive=exclusive,
                     telemetry=telemetry, init_kwargs=init_kwargs) as ex:
        planned = budget_s
        if resume is not None:
            camp = store.campaign(resume)
            planned = max(0.0, float(camp.spec.get("budget_s", 0.0)) - spent_seconds(store, resume))
        started = time.time()
        # telemetry is read in the actors, next to their GPUs (see `GpuActor.run`)
        with LeasedCampaign(store, ex.leases, telemetry=False, target_factory=ex.target_factory) as frame:
            res = run_soak(frame, items, budget_s=budget_s, resume=resume, name=name, spec_extra=spec_extra,
                           allocation=allocation, observer=observer)
        lost = capacity_lost(ex.lost, len(ex.leases), started, planned)
        every_gpu_lost = len(ex.lost) == len(ex.leases)
    spec = dict(store.campaign(res.campaign_id).spec)
    if ex.telemetry_summary:
        spec["telemetry"] = {**spec.get("telemetry", {}), **ex.telemetry_summary}
    if lost:
        spec["lost"] = list(spec.get("lost", [])) + lost
        spec["notes"] = list(spec.get("notes", [])) + [n["note"] for n in lost]
    if ex.telemetry_summary or lost:
        store.update_campaign_spec(res.campaign_id, spec)
    status = res.status
    if every_gpu_lost and time.time() < started + planned:  # nothing left to run on: resume it
        status = INTERRUPTED
        store.set_campaign_status(res.campaign_id, status)
    return dataclasses.replace(res, status=status, lost=lost)
