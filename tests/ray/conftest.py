"""Fixtures for the Ray tests: one real multi-node cluster (a head and two GPU nodes, each a
`ray start` process with its own fake GPUs and lease folder) shared by a module's tests, and
a Ray session folder per test. Nothing here imports Ray: without it the tests that need it
skip with a reason and the others (the address probe) still run."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from cluster import NODES, start_cluster

# Ray in this process (`ray.init` of a test) reports no usage statistics: no traffic off loopback.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="module")
def cluster():
    """The module's cluster; torn down with every process it started verified gone."""
    t0 = time.monotonic()
    c = start_cluster(NODES)
    c.timings = {"start_s": round(time.monotonic() - t0, 1),
                 **{f"{n.name}_up_s": round(n.started_s, 1) for n in c.nodes.values()}}
    try:
        yield c
    finally:
        t1 = time.monotonic()
        survivors = c.stop()
        c.timings["stop_s"] = round(time.monotonic() - t1, 1)
        print(f"\nray cluster timings: {c.timings}; survivors after stop: {survivors}")
        assert survivors == [], f"processes of the test cluster survived its teardown: {survivors}"


@pytest.fixture
def ray_temp_dir():
    """A Ray session folder of the test's own, removed after it (Ray's default, /tmp/ray, keeps
    every session forever). Short: Ray's unix sockets live under it (108-byte path limit)."""
    path = Path(tempfile.mkdtemp(prefix="hzray-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
