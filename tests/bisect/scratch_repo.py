"""A generated git repository for the `hazards bisect` tests: a fake test that fails at a
known rate from a known commit on, a build that fails at chosen commits."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# The fake test: fails (exit 1, a mismatch) when a random 16-bit number is below THRESHOLD
# (the rate times 65536, read from the commit's `rate` file); sleeps SLEEP seconds first.
FAKE_TEST = """#!/bin/sh
sleep "$(cat sleep)"
r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
if [ "$r" -lt "$(cat rate)" ]; then echo "MISMATCH at rate $(cat rate)/65536"; exit 1; fi
exit 0
"""
# The build: a commit with a NO_BUILD file does not build; the test runs the built copy.
BUILD = """#!/bin/sh
if [ -e NO_BUILD ]; then echo "error: this commit does not build" >&2; exit 1; fi
cp test.sh run.sh && chmod +x run.sh
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, n: int, culprit: int, rate: float, unbuildable: tuple[int, ...] = (),
              sleep_s: float = 0.0) -> list[str]:
    """A repository of `n` commits (full ids, oldest first) whose test fails at `rate` from
    commit `culprit` on, 0 before; the commits in `unbuildable` do not build."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "test.sh").write_text(FAKE_TEST)
    (path / "build.sh").write_text(BUILD)
    (path / "sleep").write_text(f"{sleep_s}\n")
    (path / ".gitignore").write_text("run.sh\n")
    shas = []
    for i in range(n):
        (path / "rate").write_text(f"{round((rate if i >= culprit else 0.0) * 65536)}\n")
        (path / "NO_BUILD").unlink(missing_ok=True)
        if i in unbuildable:
            (path / "NO_BUILD").write_text("")
        (path / f"change-{i}.txt").write_text(f"change {i}\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"change {i}" + (" (the culprit)" if i == culprit else ""))
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def checkout_state(repo: Path) -> tuple[str, str, str, str]:
    """What the user sees of their checkout: HEAD, status, worktrees, a file's content."""
    return (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain", "--ignored"),
            git(repo, "worktree", "list", "--porcelain"), (repo / "rate").read_text())
