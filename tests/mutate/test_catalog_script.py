"""ci/gpu/mutate-catalog.sh's row filter: ROWS=a,b runs only those rows (in the table's order),
no ROWS runs every row, a name that is no row is a one-line error before anything runs.
FAMILY@A-B keeps only that row's mutants on lines A-B. DRY_RUN=1 says the chosen rows and runs
nothing (no GPU, no output folder)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ci" / "gpu" / "mutate-catalog.sh"
EVERY_ROW = ["ordering", "pipeline", "barrier_layout", "deadlock", "mma_pingpong", "megakernel_layers"]


def run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("ROWS", "DRY_RUN", "BUDGET")}
    full.update(OUT=str(tmp_path / "out"), **env)
    return subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=30)


def rows_said(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("row ")]


def test_without_rows_every_row_is_chosen(tmp_path):
    proc = run_script(tmp_path, DRY_RUN="1")
    assert proc.returncode == 0, proc.stderr
    assert rows_said(proc) == EVERY_ROW
    assert not (tmp_path / "out").exists()


def test_rows_keeps_only_the_named_rows_in_the_tables_order(tmp_path):
    proc = run_script(tmp_path, DRY_RUN="1", ROWS="mma_pingpong,pipeline")
    assert proc.returncode == 0, proc.stderr
    assert rows_said(proc) == ["pipeline", "mma_pingpong"]
    assert "prebuild yes" in proc.stdout.splitlines()[1]  # mma_pingpong's slow build still starts early


def test_a_row_name_that_is_no_row_is_a_one_line_error_before_anything_runs(tmp_path):
    proc = run_script(tmp_path, ROWS="pipeline,pipelines")  # not DRY_RUN: it must stop anyway
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "'pipelines', which is no row" in proc.stderr
    assert proc.stdout == ""
    assert not (tmp_path / "out").exists()


def test_a_row_name_is_not_matched_as_a_prefix_of_another(tmp_path):
    proc = run_script(tmp_path, DRY_RUN="1", ROWS="mma")
    assert proc.returncode == 2 and rows_said(proc) == []


def test_a_row_entry_with_lines_keeps_that_rows_mutants_on_those_lines(tmp_path):
    proc = run_script(tmp_path, DRY_RUN="1", ROWS="pipeline,ordering@147-173")
    assert proc.returncode == 0, proc.stderr
    assert rows_said(proc) == ["ordering", "pipeline"]
    ordering, pipeline = proc.stdout.splitlines()
    assert "lines 147-173" in ordering and "lines all" in pipeline


def test_row_lines_that_are_not_a_range_are_a_one_line_error(tmp_path):
    proc = run_script(tmp_path, ROWS="ordering@147")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "lines must be A-B" in proc.stderr
    assert not (tmp_path / "out").exists()
