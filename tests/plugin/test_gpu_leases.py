"""One GPU lease per pytest process: xdist workers pinned to distinct (fake) GPUs."""
from __future__ import annotations

import json

import pytest

from hazards.engine import leases
from hazards.engine.gpus import gpu_available

# The conftest records what CUDA_VISIBLE_DEVICES was when it was imported: before any
# test module (and any CUDA library) is imported, the worker must already be pinned.
PINNING_CONFTEST = """
    import json, os
    from pathlib import Path

    OUT = Path(os.environ["HZ_TEST_OUT"])
    with OUT.open("a") as f:
        f.write(json.dumps({"at": "conftest", "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\\n")
"""

PINNING_TESTS = """
    import json, os, time
    from pathlib import Path

    import pytest

    OUT = Path(os.environ["HZ_TEST_OUT"])

    @pytest.mark.parametrize("i", range(6))
    def test_record_device(i, hz_gpu):
        time.sleep(0.05)  # let both workers take tests
        with OUT.open("a") as f:
            f.write(json.dumps({"at": "test", "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                                "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "hz_gpu": hz_gpu}) + "\\n")
"""


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_xdist_workers_pin_distinct_fake_gpus_before_conftest_import(inner):
    inner.write("conftest.py", PINNING_CONFTEST)
    inner.write("test_pin.py", PINNING_TESTS)
    out = inner.path / "records.jsonl"
    res = inner.run("-n", "2", env={"HZ_FAKE_GPUS": "0,1", "HZ_TEST_OUT": str(out)})
    assert res.ret == 0, res.stdout + res.stderr
    recs = _records(out)
    at_import = {r["worker"]: r["cvd"] for r in recs if r["at"] == "conftest" and r["worker"] != "main"}
    assert sorted(at_import) == ["gw0", "gw1"]
    assert sorted(at_import.values()) == ["0", "1"]  # distinct devices, pinned before conftest import
    tests = [r for r in recs if r["at"] == "test"]
    assert len(tests) == 6
    for r in tests:
        assert r["cvd"] == r["hz_gpu"] == at_import[r["worker"]]
    log = leases.read_lease_log(inner.lease_dir)
    acquired = {e["holder"]: e["gpu"] for e in log if e["event"] == "acquire"}
    assert acquired == {"pytest:gw0": at_import["gw0"], "pytest:gw1": at_import["gw1"]}
    assert sorted(e["holder"] for e in log if e["event"] == "release") == ["pytest:gw0", "pytest:gw1"]
    assert leases.current_holders(inner.lease_dir) == {}  # nothing held after the session


def test_gpu_fixture_skips_with_the_holder_when_the_only_gpu_is_leased(inner, monkeypatch):
    inner.write("test_pin.py", PINNING_TESTS)
    monkeypatch.setenv("HZ_FAKE_GPUS", "0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with leases.acquire("0", "someone-else", lock_dir=inner.lease_dir):
        res = inner.run("-rs", env={"HZ_FAKE_GPUS": "0", "HZ_TEST_OUT": str(inner.path / "r.jsonl")})
    assert res.ret == 0 and res.outcomes == {"skipped": 6}, res.stdout
    assert "no free GPU lease for pytest process main" in res.stdout
    assert "someone-else" in res.stdout


def test_no_lease_option_leaves_cuda_visible_devices_alone(inner):
    inner.write("conftest.py", PINNING_CONFTEST)
    inner.write("test_ok.py", "def test_ok():\n    pass\n")
    out = inner.path / "r.jsonl"
    res = inner.run("--hz-no-lease", env={"HZ_FAKE_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "1",
                                           "HZ_TEST_OUT": str(out)})
    assert res.ret == 0
    assert _records(out)[0]["cvd"] == "1"
    assert leases.read_lease_log(inner.lease_dir) == []


def test_lease_follows_the_callers_cuda_visible_devices(inner):
    inner.write("conftest.py", PINNING_CONFTEST)
    inner.write("test_ok.py", "def test_ok():\n    pass\n")
    out = inner.path / "r.jsonl"
    res = inner.run(env={"HZ_FAKE_GPUS": "0,1,2", "CUDA_VISIBLE_DEVICES": "2", "HZ_TEST_OUT": str(out)})
    assert res.ret == 0
    assert _records(out)[0]["cvd"] == "2"


@pytest.mark.skipif(gpu_available(), reason="checks the skip reason on a machine without a GPU")
def test_hz_gpu_marker_skips_with_a_clear_reason_without_a_gpu(inner):
    inner.write("test_gpu.py", """
        import pytest

        @pytest.mark.hz_gpu
        def test_needs_gpu():
            raise AssertionError("must not run without a GPU")
    """)
    res = inner.run("-rs")
    assert res.ret == 0 and res.outcomes == {"skipped": 1}
    assert "no usable NVIDIA GPU" in res.stdout
