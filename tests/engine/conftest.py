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
