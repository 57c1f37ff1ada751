"""Fixtures for the hang-forensics tests (helpers live in forensics_helpers.py)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from forensics_helpers import PROGRAMS
from hazards.engine.watchdog import collector_budget, set_collector_budget


@pytest.fixture(scope="session")
def hung_native(tmp_path_factory) -> Path:
    """tests/forensics/programs/hung_native.c built with -g (skips without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the hung native program")
    out = tmp_path_factory.mktemp("native") / "hung_native"
    subprocess.run([cc, "-g", "-O0", "-pthread", "-o", str(out), str(PROGRAMS / "hung_native.c")], check=True)
    return out


@pytest.fixture
def hang_budget():
    """Set the watchdog's hang budget for one test; restored afterwards."""
    before = collector_budget()
    yield set_collector_budget
    set_collector_budget(before)


@pytest.fixture
def forensics_on():
    """The hang-forensics collector registered for one test only."""
    from hazards.engine.forensics import install_hang_collector, uninstall_hang_collector

    install_hang_collector()
    yield
    uninstall_hang_collector()
