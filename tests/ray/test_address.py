"""A Ray head that is down or an address that is not one: one line, exit 2, nothing stored, fast.

Ray's own connect retries for minutes (a refused port: still retrying after 409 s, see
docs/results/ray-multinode-cpu.md); `hazards soak --executor ray --address` probes the
address first.
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cluster import GARBAGE, HTTP2_NOT_FOUND, LOOPBACK, NO_RAY, fake_head, free_port, full_backlog, have_ray, ray_env

from hazards.engine.errors import UserError
from hazards.engine.executors.ray_executor import loopback_kept, probe_address
from hazards.engine.store import Store

# One Ray cluster at a time on this machine: every Ray test runs on the same xdist worker.
pytestmark = pytest.mark.xdist_group("ray-cluster")

FAST_S = 20.0  # the CLI's start-up included; the probe itself gives up after 5 s

# Every kind of address that is not a Ray head, each made on 127.0.0.1 by the test itself
# (never a documentation range "nothing routes to": this machine sends nothing off loopback).
REFUSED, SILENT, NOT_GRPC, GARBAGE_THEN_CLOSED, NO_ANSWER = (
    "nothing listens", "a silent port", "an HTTP/2 server", "garbage, then hung up", "a full backlog")


@pytest.fixture
def bad_head(request):
    """The address (on 127.0.0.1) of the kind of non-head named by the test's parameter."""
    kind = request.param
    if kind == REFUSED:
        yield f"{LOOPBACK}:{free_port()}"
        return
    made = {SILENT: lambda: fake_head(), NOT_GRPC: lambda: fake_head(HTTP2_NOT_FOUND),
            GARBAGE_THEN_CLOSED: lambda: fake_head(GARBAGE, hang_up=True), NO_ANSWER: full_backlog}[kind]
    with made() as address:
        yield address


def soak_at(address: str, tmp_path) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hazards", "soak", "--executor", "ray", "--address", address,
                           "--no-families", "--targets", str(tmp_path / "t.toml"), "--store",
                           str(tmp_path / "results.db")], cwd=tmp_path, env=ray_env(), capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stderr, time.monotonic() - t0


# What the probe says for each kind: refused and no answer at all are "cannot reach", anything
# that accepted the connection but did not answer gRPC is "not a Ray head", with why.
PROBE_SAYS = {
    REFUSED: "cannot reach the Ray head at {address}: Connection refused",
    SILENT: "{address} is not a Ray head: something listens there but does not answer gRPC (no answer to a gRPC call)",
    NOT_GRPC: "{address} is not a Ray head: something listens there but does not answer gRPC "
              "(an HTTP answer that is not gRPC)",
    GARBAGE_THEN_CLOSED: "{address} is not a Ray head: something listens there but does not answer gRPC "
                         "(the connection was closed)",
    NO_ANSWER: "cannot reach the Ray head at {address}: no answer within 1s",
}


@pytest.mark.parametrize("bad_head", list(PROBE_SAYS), indirect=True)
def test_the_probe_tells_each_kind_of_non_head_apart_within_its_timeout(bad_head, request):
    kind = request.node.callspec.params["bad_head"]
    t0 = time.monotonic()
    with pytest.raises(UserError) as refused:
        probe_address(bad_head, timeout=1.0)
    took = time.monotonic() - t0
    assert str(refused.value).startswith(PROBE_SAYS[kind].format(address=bad_head)), str(refused.value)
    assert "\n" not in str(refused.value)
    assert took < 3.0  # one timeout (1 s) at most, plus slack for a loaded machine


@pytest.mark.skipif(not have_ray(), reason=NO_RAY)
@pytest.mark.parametrize("bad_head", [REFUSED, SILENT, NOT_GRPC, NO_ANSWER], indirect=True)
def test_a_head_that_does_not_answer_is_one_line_exit_2_and_no_campaign(bad_head, tmp_path, request):
    kind = request.node.callspec.params["bad_head"]
    (tmp_path / "t.toml").write_text(f'[[target]]\nname = "t"\nargv = ["{sys.executable}", "-c", "pass"]\n')
    rc, err, took = soak_at(bad_head, tmp_path)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and bad_head in lines[0], err
    assert ("cannot reach the Ray head" if kind in (REFUSED, NO_ANSWER) else "is not a Ray head") in lines[0]
    assert took < FAST_S
    db = tmp_path / "results.db"
    assert not db.exists() or Store(db, read_only=True).campaigns() == []


@pytest.mark.parametrize("address, says", [
    ("no-such-host.invalid:6379", "unknown host"),  # .invalid never resolves (RFC 6761); conftest answers it
    ("headnode", "is not HOST:PORT"),
    ("headnode:http", "is not HOST:PORT"),
    ("ray://headnode:0", "is not HOST:PORT"),
])
def test_an_address_that_names_no_head_is_a_user_error(address, says):
    t0 = time.monotonic()
    with pytest.raises(UserError, match=says):
        probe_address(address, timeout=1.0)
    assert time.monotonic() - t0 < FAST_S


@pytest.mark.skipif(not have_ray(), reason=NO_RAY)
def test_the_probe_accepts_a_real_ray_head(ray_temp_dir):
    """The GCS port of a Ray head answers the probe's gRPC call."""
    import ray

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    with loopback_kept():
        ctx = ray.init(num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                       _node_ip_address=LOOPBACK, _temp_dir=str(ray_temp_dir))
    try:
        probe_address(ctx.address_info["gcs_address"], timeout=5.0)
    finally:
        ray.shutdown()


def test_an_address_without_the_ray_executor_is_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hazards", "soak", "--address", f"{LOOPBACK}:6379", "--no-families",
                           "--store", str(tmp_path / "results.db")], cwd=tmp_path, env=ray_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["hazards: error: --address names a Ray cluster: it needs --executor ray"]
    assert not (tmp_path / "results.db").exists()


def test_a_local_cluster_the_executor_starts_is_on_loopback(monkeypatch):
    """`hazards soak --executor ray` without --address starts a cluster for this machine only:
    its node binds to 127.0.0.1, whatever interface Ray would guess, with no dashboard."""
    import types

    from hazards.engine.executors import ray_executor

    calls = []
    fake_ray = types.SimpleNamespace(is_initialized=lambda: False, init=lambda **kw: calls.append(kw),
                                     exceptions=types.SimpleNamespace(RayError=RuntimeError))
    monkeypatch.setattr(ray_executor, "import_ray", lambda: fake_ray)
    ray_executor.RayExecutor()._init()
    assert calls and calls[0]["address"] is None
    assert calls[0]["_node_ip_address"] == LOOPBACK and calls[0]["include_dashboard"] is False


@pytest.mark.skipif(not have_ray(), reason=NO_RAY)
def test_ray_keeps_a_loopback_node_address_while_loopback_kept():
    """Ray on Linux swaps 127.0.0.1 for the outbound interface's address; `loopback_kept`
    (around every ray.init and `ray start` of ours) keeps it, and only loopback hosts."""
    from ray._private import services

    real = services.resolve_ip_for_localhost
    with loopback_kept():
        assert services.resolve_ip_for_localhost(LOOPBACK) == LOOPBACK
        assert services.resolve_ip_for_localhost("localhost") == "localhost"
        assert services.resolve_ip_for_localhost("headnode") == "headnode"
    assert services.resolve_ip_for_localhost is real
