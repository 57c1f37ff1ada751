"""Where the kernel sources are: the one place that knows.

The repository's top-level `standalone/` folder (kernels, the harness, the tripwire headers
users include) ships in the wheel as package data under `hazards/standalone/` (a setuptools
`package-dir` mapping, like the engine's). An installed package finds it through
`importlib.resources`; a source checkout (editable install or none) has no
`hazards/standalone/` and uses the sibling folder `standalone/`, exactly as
`hazards/__init__.py` maps the engine. Nothing here ever depends on the current folder.
`revision_sources` gives the tree as it is at a git revision of the checkout it lives in (a
perf-gate side `megakernel_layers:NAME@REV`), extracted once per content into the build
cache, never into the user's folders.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import tarfile
from pathlib import Path

from hazards.engine.errors import UserError


@functools.lru_cache(maxsize=None)
def standalone_dir() -> Path:
    """The kernel source tree (`standalone/` of the checkout, or the installed package data)."""
    installed = importlib.resources.files("hazards").joinpath("standalone")
    if installed.is_dir():
        return Path(str(installed))
    checkout = Path(str(importlib.resources.files("hazards"))).parent / "standalone"
    if checkout.is_dir():
        return checkout
    raise UserError("the kernel sources are missing: neither the installed package data "
                    f"({installed}) nor a checkout's {checkout} exists; reinstall gpu-hazards")


def family_dir(folder: str) -> Path:
    """`standalone/<folder>/`: one family's kernel folder."""
    return standalone_dir() / folder


def include_dir() -> Path:
    """The headers a user's own kernels include (`-I` this for `hz_tripwire.h`)."""
    return standalone_dir() / "include"


@dataclasses.dataclass(frozen=True)
class RevisionSources:
    """The kernel source tree as it is at one commit."""

    commit: str       # the full commit id the revision named
    standalone: Path  # that commit's `standalone/`, extracted under the build cache


def revision_sources(rev: str, folder: str, *, standalone: Path | None = None) -> RevisionSources:
    """`standalone/` (or the tree `standalone` names) as it is at git revision `rev` of the
    checkout it lives in, with `standalone/<folder>/` required. The tree is extracted with
    `git archive` into the build cache's `revisions/standalone-<git tree id>/`: the folder is
    named by its content, so two revisions with the same tree share it and a changed tree
    never reuses it. UserError (one line) for a bad revision string, no git, a tree outside
    any git checkout or untracked in it, a checkout git will not read (git's reason), a
    revision git does not know, one without the family's folder, or a tree that cannot be
    extracted whole (a full disk, a link out of it, files its .gitattributes export-ignore)."""
    from hazards.bisect.history import GitMissing, git
    from hazards.engine import toolchain

    if not rev or rev.startswith("-") or any(c.isspace() or ord(c) < 32 for c in rev):
        raise UserError(f"bad git revision {rev!r}")
    here = Path(standalone or standalone_dir()).resolve()
    need = f"a side at a git revision (@{rev})"
    try:
        top = Path(git(here, "rev-parse", "--show-toplevel", needed_by=need).strip()).resolve()
    except GitMissing:
        raise
    except UserError as exc:
        if "not a git repository" not in str(exc):
            raise  # a checkout git will not read (dubious ownership, a broken .git): git's reason
        raise UserError(f"the kernel sources {here} are not in a git checkout: {need} needs the "
                        "repository's history (an installed package has none)") from None
    prefix = here.relative_to(top).as_posix() if here != top else ""
    if not git(top, "ls-files", "--", prefix or ".", needed_by=need).strip():
        # an installed package inside a virtual environment inside another repository
        raise UserError(f"the kernel sources {here} are no part of the git checkout {top} (untracked): {need} "
                        "needs the history of the repository they come from")
    try:
        commit = git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", needed_by=need).strip()
    except UserError:
        raise UserError(f"git does not know revision {rev!r} in {top}") from None
    inside = f"{prefix}/{folder}" if prefix else folder
    try:
        kind = git(top, "cat-file", "-t", f"{commit}:{inside}", needed_by=need).strip()
    except UserError:
        kind = None
    if kind != "tree":
        raise UserError(f"revision {rev!r} ({commit[:12]}) has no {inside}/ (the family's folder)")
    tree = git(top, "rev-parse", "--verify", f"{commit}:{prefix}" if prefix else f"{commit}^{{tree}}",
               needed_by=need).strip()

    cache = toolchain.cache_dir("revisions")
    # one name, not one per process: only the holder of the tree's lock writes it, so what a
    # killed extraction left is overwritten, then removed (its half tree: `cached_output`)
    tar = cache / f".standalone-{tree}.tar"

    treeish = f"{commit}:{prefix}" if prefix else commit

    def extract(tmp: Path) -> None:
        try:
            git(top, "archive", "--format=tar", "-o", str(tar), treeish, needed_by=need)
            tmp.mkdir()
            with tarfile.open(tar) as t:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: no links or paths out of tmp
                    t.extractall(tmp, filter="data")
                else:
                    t.extractall(tmp)
            got = {p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_symlink() or not p.is_dir()}
        except (OSError, tarfile.TarError) as exc:  # a full disk, a link out of the tree
            raise UserError(f"cannot extract revision {rev!r} ({commit[:12]}) into {cache}: "
                            f"{' '.join(str(exc).split())}") from None
        finally:
            tar.unlink(missing_ok=True)
        # `git archive` leaves out what the tree's .gitattributes mark export-ignore: that
        # tree would build another binary than the revision's (submodules: no files, skipped)
        entries = [e.split("\t", 1) for e in git(top, "ls-tree", "-r", "-z", treeish, needed_by=need).split("\0") if e]
        missing = sorted(path for meta, path in entries if meta.split()[1] != "commit" and path not in got)
        if missing:
            raise UserError(f"revision {rev!r} ({commit[:12]}): git archive left out {len(missing)} file"
                            f"{'s' if len(missing) > 1 else ''} of the revision ({', '.join(missing[:3])}"
                            f"{', ...' if len(missing) > 3 else ''}: export-ignore in its .gitattributes); "
                            "built without them, it would not be that revision's binary")

    return RevisionSources(commit, toolchain.cached_output(cache / f"standalone-{tree}", extract))
