"""Fixtures for the family tests: built binaries (skipped without nvcc), a private store."""
from __future__ import annotations

import shutil

import pytest

from hazards.engine.toolchain import SM90A


def _nvcc_or_skip() -> None:
    from hazards.engine.build import find_compiler
    from hazards.engine.errors import ToolchainMissing

    try:
        find_compiler(SM90A)
    except ToolchainMissing as exc:
        pytest.skip(f"nvcc not available, cannot compile for sm_90a: {exc}")


@pytest.fixture(scope="session")
def family_binaries() -> dict:
    """{family name: path} of every runtime family built for sm_90a (cached builds)."""
    _nvcc_or_skip()
    from hazards.families import all_families
    from hazards.stress_family import family_binary

    return {f.name: family_binary(f) for f in all_families() if f.binary}


@pytest.fixture
def store(tmp_path):
    from hazards.engine.store import Store

    with Store(tmp_path / "results.db") as s:
        yield s


@pytest.fixture
def frame(store):
    """A leased-campaign frame over the private store, without a GPU (fake targets need none)."""
    from hazards.engine.campaign import LeasedCampaign

    with LeasedCampaign.on_cpu(store, "test") as f:
        yield f


@pytest.fixture
def gxx() -> str:
    path = shutil.which("g++") or shutil.which("clang++") or shutil.which("clang++-19")
    if path is None:
        pytest.skip("no host C++ compiler (g++/clang++) to build the JSON test driver")
    return path
