"""The megakernel library compiles for sm_90a with nvcc (skipped without nvcc); a build past its
time limit is a one-line error that leaves no compiler running."""
from __future__ import annotations

import ctypes
import os
import shutil

import pytest

from hazards.ragged_decode import build
from hazards.engine.toolchain import SM90A

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not os.environ.get("HZ_NVCC"),
    reason="nvcc is not installed: the sm_90a build of standalone/megakernel cannot be checked")


@needs_nvcc
def test_library_compiles_for_sm90a_without_spills():
    lib = build.build_library()
    assert lib.exists() and lib.suffix == ".so"
    report = build.ptxas_report(lib)
    assert SM90A in report
    assert "0 bytes spill stores" in report and "0 bytes spill loads" in report


@needs_nvcc
def test_library_exports_the_launch_api():
    lib = ctypes.CDLL(str(build.build_library()))  # loading needs no GPU (cudart is static)
    for name in ("hz_rd_launch", "hz_rd_occupancy", "hz_rd_error_string", "hz_rd_graph_node_counts"):
        assert hasattr(lib, name)
    lib.hz_rd_head_dim.restype = ctypes.c_int
    assert lib.hz_rd_head_dim() == 128


@needs_nvcc
def test_cache_key_follows_the_source_and_its_headers(tmp_path, monkeypatch):
    src, hdr = tmp_path / "k.cu", tmp_path / "k.cuh"
    src.write_text('#include "k.cuh"\n' + build.SOURCE.read_text())
    hdr.write_text("// header\n")
    monkeypatch.setattr(build, "SOURCE", src)
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "b"))
    first = build.library_path()
    assert first.parent == tmp_path / "b" / "megakernel"
    src.write_text(src.read_text() + "\n// changed\n")
    second = build.library_path()
    hdr.write_text("// header changed\n")
    assert len({first, second, build.library_path()}) == 3


def test_a_build_past_its_time_limit_is_a_one_line_error_and_leaves_no_compiler_behind(tmp_path, monkeypatch,
                                                                                          stray_sleep):
    fake = tmp_path / "nvcc"
    fake.write_text(f"#!/bin/sh\n{stray_sleep.command}\n")  # a child that outlives a killed nvcc
    fake.chmod(0o755)
    monkeypatch.setattr(build, "find_nvcc", lambda: str(fake))
    monkeypatch.setattr(build, "library_path", lambda *a, **k: tmp_path / "out" / "ragged_decode-x.so")
    monkeypatch.setattr(build.toolchain, "COMPILE_TIMEOUT_S", 0.5)
    with pytest.raises(build.UserError, match="timed out after 0.5 s"):
        build.build_library()
    assert not stray_sleep.left(), "the compiler's child outlived the time limit"
