"""Fixtures for the engine tests (helpers live in engine_fakes.py)."""
from pathlib import Path

import pytest


@pytest.fixture
def pidfile(tmp_path: Path) -> Path:
    return tmp_path / "pids"


@pytest.fixture
def fake_env(pidfile: Path) -> dict[str, str]:
    """Extra env for a fake target: where its processes record their pids."""
    return {"HZ_FAKE_PIDFILE": str(pidfile)}


@pytest.fixture
def without_cgroups(monkeypatch):
    """Children started without a cgroup of their own, as on a machine that does not delegate
    cgroup v2: the watchdog's other ways of finding descendants must do on their own."""
    from hazards.engine.containment import CONTAINMENT

    CONTAINMENT.describe()  # set up first, so the setting below is not reset
    monkeypatch.setattr(CONTAINMENT, "cgroup_root", None)
