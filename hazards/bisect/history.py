"""The commits `hazards bisect` walks, and a built checkout of each, never the user's.

- `first_parent_range(repo, good, bad)`: the first-parent history from the good end to the
  bad end, both included (UserError when the good end is not on it).
- `Checkouts`: each commit is checked out with `git worktree add --detach` in a scratch
  folder of ours (default: the build cache's `bisect/<repository>/`), built there with the
  user's `--build` command, and unregistered from the repository at once (the worktree's
  admin folder and its `.git` link removed: `git worktree list` shows nothing of ours, the
  user's checkout, index and HEAD are never touched). The built folder stays as the build
  cache of that commit and build command: a second look at the commit (a resumed
  bisection, another bisection of the same range) builds nothing. A build that failed is
  cached as failed (the commit is skipped without building it again). A folder a killed
  bisection left half made is removed on the next start (`recover`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from hazards.engine.errors import UserError
from hazards.engine.proctree import communicate_or_kill_group, start_in_group

BUILD_TIMEOUT_S = 3600.0
GIT_TIMEOUT_S = 120.0
_LOG_TAIL = 4000


@dataclasses.dataclass(frozen=True)
class Commit:
    sha: str
    subject: str


# What makes git read another repository than `-C`'s (`git rev-parse --local-env-vars`, the
# config ones left): a git hook (GIT_INDEX_FILE in pre-commit) or a `git -C` caller exports them.
_REPOSITORY_ENV = ("GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_OBJECT_DIRECTORY", "GIT_DIR", "GIT_WORK_TREE",
                   "GIT_IMPLICIT_WORK_TREE", "GIT_GRAFT_FILE", "GIT_INDEX_FILE", "GIT_NO_REPLACE_OBJECTS",
                   "GIT_REPLACE_REF_BASE", "GIT_PREFIX", "GIT_INTERNAL_SUPER_PREFIX", "GIT_SHALLOW_FILE",
                   "GIT_COMMON_DIR")


class GitMissing(UserError):
    """git is not installed."""


def git(repo: Path, *args: str, needed_by: str = "hazards bisect") -> str:
    """stdout of `git -C repo ARGS` (of that repository, whatever a hook exported); UserError
    (one line) when git fails, GitMissing (naming `needed_by`) when there is no git."""
    env = {k: v for k, v in os.environ.items() if k not in _REPOSITORY_ENV}
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              env=env)
    except FileNotFoundError:
        raise GitMissing(f"{needed_by} needs git, and git is not installed") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"git {' '.join(args)} took more than {GIT_TIMEOUT_S:g} s in {repo}") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()] or [f"exit {proc.returncode}"]
        # git's reason, not the hint after it (dubious ownership ends with a command to run)
        err = next((ln for ln in lines if ln.startswith(("fatal:", "error:"))), lines[-1])
        raise UserError(f"git {' '.join(args)} failed in {repo}: {err}")
    return proc.stdout


def repo_root(path: Path) -> Path:
    """The top folder of the git checkout `path` is in (UserError if it is in none)."""
    if not path.is_dir():
        raise UserError(f"--repo {path} is not a folder")
    try:
        return Path(git(path, "rev-parse", "--show-toplevel").strip())
    except UserError:
        raise UserError(f"{path} is not in a git checkout (hazards bisect walks its history)") from None


def resolve(repo: Path, ref: str, flag: str) -> str:
    """The full commit id `ref` names (UserError naming `flag` otherwise)."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    except UserError:
        raise UserError(f"{flag} {ref!r} names no commit in {repo}") from None


def first_parent_range(repo: Path, good: str, bad: str) -> list[Commit]:
    """[good, ..., bad]: the bad end's first-parent history back to the good end."""
    good_sha, bad_sha = resolve(repo, good, "--good"), resolve(repo, bad, "--bad")
    if good_sha == bad_sha:
        raise UserError(f"--good and --bad name the same commit ({good_sha[:12]}): nothing to bisect")
    lines = git(repo, "log", "--first-parent", "--format=%H%x1f%s", f"{good_sha}..{bad_sha}").splitlines()
    commits = [Commit(*line.split("\x1f", 1)) for line in lines if "\x1f" in line][::-1]
    if not commits or git(repo, "rev-parse", f"{commits[0].sha}^1").strip() != good_sha:
        raise UserError(f"--good {good} is not on the first-parent history of --bad {bad} "
                        "(hazards bisect walks first parents only, like `git bisect --first-parent`)")
    subject = git(repo, "log", "-1", "--format=%s", good_sha).strip()
    return [Commit(good_sha, subject), *commits]


def _build_key(build: str | None) -> str:
    return hashlib.sha256((build or "").encode()).hexdigest()[:8]


class Checkouts:
    """Built checkouts of commits of `repo` under `scratch` (see the module's docstring)."""

    def __init__(self, repo: Path, scratch: Path, build: str | None, *, build_timeout_s: float = BUILD_TIMEOUT_S,
                 env: dict[str, str] | None = None) -> None:
        self.repo, self.scratch, self.build, self.build_timeout_s = repo, scratch, build, build_timeout_s
        self.env = env
        try:
            scratch.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create the bisect scratch folder {scratch}: {e.strerror}") from None
        self.recover()

    def folder(self, sha: str) -> Path:
        return self.scratch / f"{sha[:12]}-{_build_key(self.build)}"

    def _record(self, sha: str) -> Path:
        return self.scratch / f"{self.folder(sha).name}.json"

    def _log(self, sha: str) -> Path:
        return self.scratch / f"{self.folder(sha).name}.build.log"

    def cached(self, sha: str) -> dict | None:
        """The build record of `sha` with this build command ({"ok", "seconds", "log", ...}), if any."""
        try:
            return json.loads(self._record(sha).read_text())
        except (OSError, ValueError):
            return None

    def recover(self) -> None:
        """Unregister and remove what a killed bisection left half made (a folder still
        linked to the repository: its build never finished)."""
        for link in self.scratch.glob("*/.git"):
            self._unregister(link.parent)
            shutil.rmtree(link.parent, ignore_errors=True)
            (self.scratch / f"{link.parent.name}.json").unlink(missing_ok=True)

    def _unregister(self, folder: Path) -> None:
        """Forget the worktree at `folder` in the repository (its admin folder), keep the files."""
        link = folder / ".git"
        try:
            text = link.read_text().strip()
        except OSError:
            return
        if text.startswith("gitdir:"):
            admin = Path(text.split(":", 1)[1].strip())
            if admin.parent.name == "worktrees":  # only a worktree's admin folder, never a repository
                shutil.rmtree(admin, ignore_errors=True)
        link.unlink(missing_ok=True)

    def prepare(self, sha: str) -> tuple[Path | None, str]:
        """(the built checkout of `sha`, "") or (None, why it cannot be tested)."""
        rec = self.cached(sha)
        folder = self.folder(sha)
        if rec is not None and (not rec.get("ok") or folder.is_dir()):
            return (folder, "") if rec["ok"] else (None, rec.get("why", "the build failed"))
        shutil.rmtree(folder, ignore_errors=True)
        # Hooks off: the user's post-checkout hook has no business in our scratch folder.
        git(self.repo, "-c", "core.hooksPath=/dev/null", "worktree", "add", "--detach", "--force", "--quiet",
            str(folder), sha)
        try:
            ok, why, seconds = self._build(folder)
        finally:
            self._unregister(folder)
        rec = {"sha": sha, "build": self.build, "ok": ok, "why": why, "seconds": round(seconds, 3),
               "log": str(self._log(sha)), "at": time.time()}
        self._record(sha).write_text(json.dumps(rec))
        if not ok:
            shutil.rmtree(folder, ignore_errors=True)
            return None, why
        return folder, ""

    def _build(self, folder: Path) -> tuple[bool, str, float]:
        """Run the build command in `folder` (its own process group, killed on timeout or
        interruption); (ok, why not, seconds)."""
        t0 = time.monotonic()
        if not self.build:
            return True, "", 0.0
        log = folder.parent / f"{folder.name}.build.log"
        with open(log, "wb") as out:
            proc = start_in_group(["/bin/sh", "-c", self.build], cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                                  env=self.env)
            try:
                communicate_or_kill_group(proc, self.build_timeout_s)
            except subprocess.TimeoutExpired:
                return False, f"the build took more than {self.build_timeout_s:g} s", time.monotonic() - t0
        rc = proc.returncode
        if rc != 0:
            tail = log.read_bytes()[-_LOG_TAIL:].decode(errors="replace").strip().splitlines()
            return False, f"the build failed (exit {rc}): {tail[-1] if tail else 'no output'}", time.monotonic() - t0
        return True, "", time.monotonic() - t0
