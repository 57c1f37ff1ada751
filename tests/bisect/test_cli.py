"""`hazards bisect` end to end through the CLI, on a generated git repository whose fake test
fails at a known rate from a known commit on (some commits do not build): the culprit with
its full id, runs spent, interruption and resume, the user's checkout untouched."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scratch_repo import REPO_ROOT, checkout_state, make_repo


def bisect_argv(tmp_path: Path, repo: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "hazards", "bisect", "--repo", str(repo), "--scratch", str(tmp_path / "scratch"),
            "--store", str(tmp_path / "results.db"), "--json", *args]


def run_cli(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_finds_the_culprit_of_a_0_to_100_percent_change_skipping_unbuildable_commits(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 12, culprit=7, rate=1.0, unbuildable=(3, 8, 9))
    before = checkout_state(repo)
    proc = run_cli(bisect_argv(tmp_path, repo, "--good", shas[0], "--bad", "main", "--build", "sh build.sh",
                               "--", "./run.sh"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "found" and doc["culprit"] == shas[7] and doc["subject"] == "change 7 (the culprit)"
    assert doc["confidence"] > 0.9
    assert doc["rate_after"]["failures"] == doc["rate_after"]["runs"] > 0 and doc["rate_before"]["failures"] == 0
    tested = {c["commit"]: c for c in doc["commits"]}
    skipped = [c for c in doc["commits"] if c["verdict"] == "skipped"]
    assert skipped and all("does not build" in c["why"] and c["campaign"] is None for c in skipped)
    assert doc["runs"] == sum(c["runs"] for c in doc["commits"]) < 80
    # Every run is in the store, one campaign per commit tested (the skipped one has none).
    db = sqlite3.connect(tmp_path / "results.db")
    per_commit = dict(db.execute("SELECT c.id, count(r.seq) FROM campaigns c LEFT JOIN runs r ON r.campaign_id = c.id "
                                 "WHERE c.kind = 'bisect-commit' GROUP BY c.id").fetchall())
    assert sum(per_commit.values()) == doc["runs"]
    assert {c["campaign"] for c in doc["commits"] if c["verdict"] != "skipped"} == set(per_commit)
    assert checkout_state(repo) == before  # the user's checkout untouched
    assert not list((tmp_path / "scratch").glob("*/.git"))  # no worktree left registered


@pytest.mark.slow
def test_a_20_percent_flake_is_found_on_rates(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 8, culprit=5, rate=0.2, unbuildable=(2,))
    proc = run_cli(bisect_argv(tmp_path, repo, "--good", shas[0], "--bad", shas[-1], "--build", "sh build.sh",
                               "--", "./run.sh"), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["culprit"] == shas[5], doc
    assert doc["runs"] > 60  # a rate, not one lucky run, decided each commit
    print(f"\n0% -> 20%: culprit right, {doc['runs']} runs, confidence {doc['confidence']:.3f}")


@pytest.mark.slow
def test_interrupted_then_resumed_runs_only_what_is_missing_and_leaves_the_checkout_alone(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 10, culprit=6, rate=1.0, unbuildable=(4,), sleep_s=0.2)
    before = checkout_state(repo)
    argv = bisect_argv(tmp_path, repo, "--good", shas[0], "--bad", shas[-1], "--build", "sh build.sh", "--",
                       "./run.sh")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db_path = tmp_path / "results.db"
    deadline = time.monotonic() + 120
    stored = 0
    while time.monotonic() < deadline and proc.poll() is None:  # until the good end has runs: ends done
        try:
            with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5) as db:
                stored = db.execute("SELECT count(*) FROM runs").fetchone()[0]
        except sqlite3.Error:  # not made yet
            pass
        if stored >= 12:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert checkout_state(repo) == before
    assert not list((tmp_path / "scratch").glob("*/.git"))
    with sqlite3.connect(db_path) as db:
        bisect_id, status = db.execute("SELECT id, status FROM campaigns WHERE kind = 'bisect'").fetchone()
        runs_before = db.execute("SELECT count(*) FROM runs").fetchone()[0]
    assert status == "interrupted" and runs_before >= 12
    # Ctrl-C says how to continue, with the exact command (as run and soak do)
    assert f"hazards bisect --resume {bisect_id} --store {db_path}" in err, err

    resumed = run_cli([sys.executable, "-m", "hazards", "bisect", "--resume", str(bisect_id), "--store", str(db_path),
                       "--json"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    doc = json.loads(resumed.stdout)
    assert doc["culprit"] == shas[6]
    with sqlite3.connect(db_path) as db:
        runs_after = db.execute("SELECT count(*) FROM runs").fetchone()[0]
        spec = json.loads(db.execute("SELECT spec FROM campaigns WHERE id = ?", (bisect_id,)).fetchone()[0])
    assert runs_after == doc["runs"]  # nothing stored twice, nothing lost
    assert spec["ran_now"] == runs_after - runs_before < doc["runs"]  # the stored runs were not run again
    assert checkout_state(repo) == before


def test_a_bad_end_that_does_not_fail_is_refused_in_one_line(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 4, culprit=2, rate=0.0)
    proc = run_cli(bisect_argv(tmp_path, repo, "--good", shas[0], "--bad", shas[-1], "--run-budget", "20", "--build",
                               "sh build.sh", "--", "./run.sh"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("hazards: error: cannot bisect: the bad end never failed in "
                                                   "10 runs: nothing to bisect")


@pytest.mark.parametrize("args, says", [
    (["--good", "main", "--bad", "main", "--", "./run.sh"], "--good and --bad name the same commit"),
    (["--good", "nosuchref", "--bad", "main", "--", "./run.sh"], "--good 'nosuchref' names no commit"),
    (["--good", "main", "--bad", "main~2", "--", "./run.sh"], "is not on the first-parent history of --bad"),
    (["--good", "main~2", "--bad", "main"], "give the test command after --"),
    (["--good", "main~2", "--bad", "main", "--rate-threshold", "lots", "--", "./run.sh"], "--rate-threshold 'lots'"),
    (["--good", "main~2", "--bad", "main", "--alpha", "0.7", "--", "./run.sh"], "--alpha must be above 0"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    repo = tmp_path / "repo"
    make_repo(repo, 3, culprit=1, rate=1.0)
    proc = run_cli(bisect_argv(tmp_path, repo, *args), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr


def test_a_folder_outside_any_git_checkout_is_bad_input(tmp_path):
    (tmp_path / "plain").mkdir()
    proc = run_cli(bisect_argv(tmp_path, tmp_path / "plain", "--good", "a", "--bad", "b", "--", "true"), cwd=tmp_path)
    assert proc.returncode == 2 and "is not in a git checkout" in proc.stderr
