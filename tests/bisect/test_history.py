"""The commits `hazards bisect` walks and its built checkouts: first-parent history only,
one build per commit and build command, failed builds remembered, never a worktree left
registered in the user's repository (a build interrupted, a bisection killed mid-build)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scratch_repo import REPO_ROOT, checkout_state, git, make_repo

from hazards.bisect.history import Checkouts, first_parent_range
from hazards.engine.errors import UserError


def test_the_range_is_the_first_parent_history_from_good_to_bad(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 4, culprit=2, rate=1.0)
    git(repo, "checkout", "-q", "-b", "side", shas[1])
    (repo / "side.txt").write_text("side\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "on the side branch")
    side = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    merge = git(repo, "rev-parse", "HEAD")
    commits = first_parent_range(repo, shas[0], "main")
    assert [c.sha for c in commits] == [*shas, merge]  # the side commit is inside the merge step
    assert commits[-1].subject == "merge side"
    with pytest.raises(UserError, match="is not on the first-parent history"):
        first_parent_range(repo, side, "main")


def test_a_commit_is_built_once_per_build_command_and_a_failed_build_is_remembered(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 3, culprit=1, rate=1.0, unbuildable=(2,))
    counter = tmp_path / "builds"
    build = f"echo built >> {counter}; sh build.sh"
    before = checkout_state(repo)
    co = Checkouts(repo, tmp_path / "scratch", build)
    folder, why = co.prepare(shas[0])
    assert why == "" and (folder / "run.sh").exists() and not (folder / ".git").exists()
    assert co.prepare(shas[0]) == (folder, "")
    assert Checkouts(repo, tmp_path / "scratch", build).prepare(shas[0]) == (folder, "")  # a later bisection
    assert counter.read_text().count("built") == 1
    assert co.prepare(shas[2])[0] is None and "does not build" in co.prepare(shas[2])[1]
    assert counter.read_text().count("built") == 2  # the failure was not built again
    other = Checkouts(repo, tmp_path / "scratch", "sh build.sh && true")  # another build command: its own builds
    assert other.prepare(shas[0])[0] != folder
    assert checkout_state(repo) == before


def test_a_bisection_killed_mid_build_leaves_nothing_registered_after_the_next_start(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 2, culprit=1, rate=1.0)
    scratch = tmp_path / "scratch"
    co = Checkouts(repo, scratch, "sh build.sh")
    half = co.folder(shas[0])
    git(repo, "worktree", "add", "--detach", "--quiet", str(half), shas[0])  # as a SIGKILL mid-build leaves it
    assert len(git(repo, "worktree", "list").splitlines()) == 2
    Checkouts(repo, scratch, "sh build.sh")  # the next start
    assert git(repo, "worktree", "list").splitlines() == [git(repo, "worktree", "list").splitlines()[0]]
    assert not half.exists()


def test_ctrl_c_during_a_build_stops_it_and_leaves_the_checkout_as_it_was(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 4, culprit=2, rate=1.0)
    before = checkout_state(repo)
    marker = tmp_path / "building"
    argv = [sys.executable, "-m", "hazards", "bisect", "--repo", str(repo), "--scratch", str(tmp_path / "scratch"),
            "--store", str(tmp_path / "r.db"), "--good", shas[0], "--bad", shas[-1],
            "--build", f"touch {marker}; sleep 60", "--", "./run.sh"]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate(timeout=30)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert checkout_state(repo) == before  # no worktree registered, nothing changed
    assert not list((tmp_path / "scratch").glob("*/.git"))
    left = subprocess.run(["pgrep", "-f", f"touch {marker}; sleep 60"], capture_output=True, text=True).stdout
    assert left.strip() == ""  # the build's processes were stopped with it


def test_a_build_past_its_timeout_is_a_failed_build_and_leaves_no_process_behind(tmp_path, stray_sleep):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 2, culprit=1, rate=1.0)
    co = Checkouts(repo, tmp_path / "scratch", stray_sleep.command, build_timeout_s=0.5)
    assert co.prepare(shas[0]) == (None, "the build took more than 0.5 s")
    assert not stray_sleep.left(), "the build's compiler (here a sleep) outlived the timed-out build"


def test_the_users_git_hooks_do_not_run_in_the_scratch_checkouts(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 2, culprit=1, rate=1.0)
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {tmp_path / 'hook-ran'}\n")
    hook.chmod(0o755)
    folder, why = Checkouts(repo, tmp_path / "scratch", "sh build.sh").prepare(shas[0])
    assert folder is not None, why
    assert not (tmp_path / "hook-ran").exists()


def test_a_failed_git_says_gits_reason_not_the_advice_after_it(tmp_path):
    from hazards.bisect.history import git as run_git

    shas = make_repo(tmp_path / "repo", 2, culprit=1, rate=0.0)
    (tmp_path / "repo" / "change-1.txt").write_text("a local change\n")  # a file shas[0] has not
    with pytest.raises(UserError) as err:  # git prints the files, advice, then "Aborting"
        run_git(tmp_path / "repo", "checkout", "-q", shas[0])
    assert str(err.value).endswith(": error: Your local changes to the following files would be overwritten by "
                                   "checkout:"), err.value
