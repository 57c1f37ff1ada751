"""Fixtures for the campaign tests: fake GPUs, a private lease folder and store, no leaks."""
from __future__ import annotations

import psutil
import pytest


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    """Two fake GPUs ("0", "1"), no CUDA_VISIBLE_DEVICES, leases in a private folder."""
    monkeypatch.setenv("HZ_FAKE_GPUS", "0,1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lease_dir = tmp_path / "leases"
    monkeypatch.setenv("HZ_LEASE_DIR", str(lease_dir))
    return lease_dir


@pytest.fixture
def store(tmp_path):
    from hazards.engine.store import Store

    with Store(tmp_path / "results.db") as s:
        yield s


def _is_resource_tracker(p: psutil.Process) -> bool:
    """multiprocessing's resource tracker: started once per interpreter by any test that uses
    a spawn context (tests/engine/test_store.py), it lives as long as the test process."""
    try:
        return any("multiprocessing.resource_tracker" in part for part in p.cmdline())
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def no_leaked_children():
    """Every test must leave no child process behind."""
    yield
    me = psutil.Process()
    left = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            and not _is_resource_tracker(p)]
    assert not left, f"leaked processes: {[(p.pid, p.cmdline()) for p in left]}"


@pytest.fixture
def fake_nvml():
    """Install a fake NVML with two GPUs (GPU-aaaa, GPU-bbbb) for the test; forget it after."""
    from fake_nvml import FakeNvml

    from hazards.engine import telemetry

    nv = FakeNvml(["GPU-aaaa", "GPU-bbbb"])
    telemetry.use_nvml(nv)
    yield nv
    telemetry.use_nvml(None)
