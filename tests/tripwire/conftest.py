"""Shared fixtures for the tripwire tests: host C programs built with gcc (no GPU)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def build_host_program(src: Path, out: Path) -> Path:
    """gcc a test program against the tripwire header and its host helper (host-only mode)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc/cc) on this machine")
    cmd = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-DHZ_TW_HOST_ONLY",
           f"-I{ROOT / 'standalone' / 'include'}", str(src),
           str(ROOT / "standalone" / "tripwire_host" / "hz_tripwire_host.c"), "-lpthread", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="session")
def roundtrip_writer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_host_program(HERE / "roundtrip_writer.c", tmp_path_factory.mktemp("tw") / "roundtrip_writer")


@pytest.fixture(scope="session")
def fake_kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_host_program(HERE / "fake_kernel.c", tmp_path_factory.mktemp("tw") / "fake_kernel")
