"""`run_static_checks`, `hazards lint` and `hazards static`: exit codes and output."""
from __future__ import annotations

import pytest

from hazards.static import compile as hz_compile
from hazards.static_catalog import run_static_checks
from static_helpers import CLANG_MISSING, DATA, NVDISASM_MISSING, REPO, hazards
from hazards.engine.errors import ToolchainMissing, UserError

HAZARD = '''void f(const int* p) {
  int a, b;
  asm volatile("global_load_dword %0, %2, off\\n global_load_dword %1, %3, off"
               : "=v"(a), "=v"(b) : "v"(p), "v"(p + 1));
}
'''


@pytest.mark.skipif(bool(CLANG_MISSING or NVDISASM_MISSING), reason="needs clang-19 and nvdisasm")
def test_catalog_run_detects_every_canary_and_fails_nothing():
    found = run_static_checks()
    assert [f.format() for f in found if f.fails] == []
    detected = {f.subject for f in found if f.check == "canary-detected"}
    assert {"earlyclobber/broken", "mfma_pipeline/broken_war", "mfma_pipeline/broken_tail9",
            "mfma_pipeline/broken_single_tail", "barrier_layout/broken_shared_line",
            "barrier_layout/broken_hoisted_poll"} <= detected


def test_user_paths_get_the_check_their_kind_needs(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(HAZARD)
    found = run_static_checks([src, DATA / "moe_barrier_before.toml"], catalog=False)
    assert {f.check for f in found if f.fails} == {"early-clobber", "layout-wt-l2-line"}


def test_unknown_and_missing_paths_are_user_errors(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="don't know which static check"):
        run_static_checks([tmp_path / "notes.txt"], catalog=False)
    with pytest.raises(UserError, match="no such file"):
        run_static_checks([tmp_path / "absent.s"], catalog=False)


def test_missing_clang_is_a_clear_toolchain_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("HZ_CLANG", "/nonexistent/clang")
    with pytest.raises(ToolchainMissing, match="clang-19 with the AMDGPU backend not found .*HZ_CLANG"):
        hz_compile.compile_amdgcn(DATA / "sync.hip")


def test_lint_cli_reports_file_line_block_reason_and_exits_1(tmp_path):
    (tmp_path / "k.hip").write_text(HAZARD)
    proc = hazards("lint", str(tmp_path))
    assert proc.returncode == 1
    assert f"{tmp_path / 'k.hip'}:3: error: [early-clobber] output %0" in proc.stdout
    assert '|   asm volatile("global_load_dword' in proc.stdout


def test_lint_cli_on_clean_code_exits_0_and_bad_path_is_one_line(tmp_path):
    (tmp_path / "k.cu").write_text(HAZARD.replace('"=v"', '"=&v"'))
    assert hazards("lint", str(tmp_path)).returncode == 0
    bad = hazards("lint", str(tmp_path / "missing"))
    assert bad.returncode == 2 and bad.stderr.startswith("hazards: error: no such file")
    assert "Traceback" not in bad.stderr


def test_lint_of_the_whole_repository_is_clean():
    """Its speed is a benchmark (bench/static_lint_speed.py), not a timed test on a shared box."""
    proc = hazards("lint", ".", cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_static_cli_on_user_paths_only(tmp_path):
    (tmp_path / "moe.layout.toml").write_text((DATA / "moe_barrier_before.toml").read_text())
    proc = hazards("static", "--no-catalog", str(tmp_path))
    assert proc.returncode == 1 and "[layout-wt-l2-line]" in proc.stdout
    ok = hazards("static", "--no-catalog", str(DATA / "moe_barrier_after.toml"))
    assert ok.returncode == 0, ok.stdout
