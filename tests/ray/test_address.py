"""A Ray head that is down or an address that is not one: one line, exit 2, nothing stored, fast.

Ray's own connect retries for minutes (a refused port: still retrying after 409 s, see
docs/results/ray-multinode-cpu.md); `hazards soak --executor ray --address` probes the
address first.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from cluster import NO_RAY, free_port, have_ray, ray_env

from hazards.engine.errors import UserError
from hazards.engine.executors.ray_executor import probe_address
from hazards.engine.store import Store

# One Ray cluster at a time on this machine: every Ray test runs on the same xdist worker.
pytestmark = pytest.mark.xdist_group("ray-cluster")

FAST_S = 20.0  # the CLI's start-up included; the probe itself gives up after 5 s


# What an HTTP/2 server that is not gRPC (a web server, a transparent proxy) answers: its
# SETTINGS, then a response to stream 1 with ":status: 404" (HPACK static entry 13).
HTTP2_NOT_FOUND = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]) + bytes([0, 0, 1, 1, 5, 0, 0, 0, 1, 0x8D])


def listener(answer: bytes):
    """A TCP port that accepts connections and sends `answer` to each (b"": stays silent)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
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
            held.append(conn)
            if answer:
                conn.sendall(answer)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for s in held:
        s.close()
    srv.close()


@pytest.fixture
def silent_listener():
    """A port where something accepts connections and never says anything."""
    yield from listener(b"")


@pytest.fixture
def http2_listener():
    """A port where an HTTP/2 server that is not a gRPC server answers every request 404."""
    yield from listener(HTTP2_NOT_FOUND)


def soak_at(address: str, tmp_path) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hazards", "soak", "--executor", "ray", "--address", address,
                           "--no-families", "--targets", str(tmp_path / "t.toml"), "--store",
                           str(tmp_path / "results.db")], cwd=tmp_path, env=ray_env(), capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stderr, time.monotonic() - t0


@pytest.mark.skipif(not have_ray(), reason=NO_RAY)
@pytest.mark.parametrize("kind", ["nothing listens", "a silent port", "an HTTP/2 server"])
def test_a_head_that_does_not_answer_is_one_line_exit_2_and_no_campaign(kind, tmp_path, silent_listener,
                                                                        http2_listener):
    (tmp_path / "t.toml").write_text(f'[[target]]\nname = "t"\nargv = ["{sys.executable}", "-c", "pass"]\n')
    address = {"nothing listens": f"127.0.0.1:{free_port()}", "a silent port": silent_listener,
               "an HTTP/2 server": http2_listener}[kind]
    rc, err, took = soak_at(address, tmp_path)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and address in lines[0], err
    assert ("cannot reach the Ray head" if kind == "nothing listens" else "is not a Ray head") in lines[0]
    assert took < FAST_S
    db = tmp_path / "results.db"
    assert not db.exists() or Store(db, read_only=True).campaigns() == []


@pytest.mark.parametrize("address, says", [
    ("no-such-host.invalid:6379", "unknown host"),
    ("headnode", "is not HOST:PORT"),
    ("headnode:http", "is not HOST:PORT"),
    ("ray://headnode:0", "is not HOST:PORT"),
])
def test_an_address_that_names_no_head_is_a_user_error(address, says):
    t0 = time.monotonic()
    with pytest.raises(UserError, match=says):
        probe_address(address, timeout=1.0)
    assert time.monotonic() - t0 < FAST_S


def test_a_head_that_never_answers_the_connection_gives_up_within_the_probe_timeout():
    # TEST-NET-3 (RFC 5737): nothing routes there; a SYN is dropped or refused at once, or,
    # behind a transparent HTTP proxy (this project's sandbox has one), the proxy answers.
    t0 = time.monotonic()
    with pytest.raises(UserError, match="cannot reach the Ray head at 203.0.113.1:6379|"
                                        "203.0.113.1:6379 is not a Ray head"):
        probe_address("203.0.113.1:6379", timeout=1.0)
    assert time.monotonic() - t0 < 5


@pytest.mark.skipif(not have_ray(), reason=NO_RAY)
def test_the_probe_accepts_a_real_ray_head(ray_temp_dir):
    """The GCS port of a Ray head answers the probe's gRPC call."""
    import ray

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    ctx = ray.init(num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                   _temp_dir=str(ray_temp_dir))
    try:
        probe_address(ctx.address_info["gcs_address"], timeout=5.0)
    finally:
        ray.shutdown()


def test_an_address_without_the_ray_executor_is_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hazards", "soak", "--address", "127.0.0.1:6379", "--no-families",
                           "--store", str(tmp_path / "results.db")], cwd=tmp_path, env=ray_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["hazards: error: --address names a Ray cluster: it needs --executor ray"]
    assert not (tmp_path / "results.db").exists()
