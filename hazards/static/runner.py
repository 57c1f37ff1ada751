"""The static checks that apply to a user's paths, chosen by file kind: `check_paths`.

C/C++/CUDA/HIP sources get the inline-asm source lint; `.s` listings the AMDGCN checks;
`.sass` listings and `.cubin` files the NVIDIA SASS checks; `.toml` / `.json` files (in a
directory: `*.layout.toml` / `*.layout.json`) the barrier-layout check. The catalog's own
families are checked by `hazards.static_catalog`, which builds on this module.
More in docs/static-checks.md.
"""
from __future__ import annotations

import concurrent.futures
import contextvars
import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

from hazards.static import asm_lint, checks
from hazards.static.findings import Finding
from hazards.engine.errors import ToolchainMissing, UserError
from hazards.engine.proctree import ToolGroups

LISTING_SUFFIXES = {".s": "amdgcn", ".sass": "sass", ".cubin": "cubin"}
LAYOUT_SUFFIXES = (".layout.toml", ".layout.json")


@dataclasses.dataclass(frozen=True)
class Subject:
    """One thing the static checks judge: `label` names it (what the progress shows as being
    compiled), `check()` returns its findings. (Other work made of compiles uses it too:
    `hazards.checkrun.family_builds`, whose `check()` returns a family's work items.)"""

    label: str
    check: Callable[[], list[Any]]


class StepObserver(Protocol):
    """Who watches a static phase (`hazards.cli.progress.CampaignProgress`)."""

    def steps_begin(self, what: str, total: int, workers: int, doing: str = "compiling and checking") -> None: ...
    def step_started(self, label: str) -> None: ...
    def step_finished(self, label: str) -> None: ...
    def steps_end(self) -> None: ...


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def run_subjects(subjects: list[Subject], *, jobs: int | None = None, observer: StepObserver | None = None,
                 what: str = "static checks", doing: str = "compiling and checking") -> Iterator[list[Any]]:
    """Each subject's findings, in the subjects' order, up to `jobs` (default: the machine's
    cores) judged at once. The first exception of a subject, in order, is raised; the
    subjects not started then are not, and the compilers the others started are killed (as
    Ctrl-C or a stop signal does: a worker thread cannot be interrupted, its child can).
    Only this phase's own compilers (`ToolGroups`): never those of a phase running beside it
    in the same process. Consume it to the end: a generator left before its end is a phase
    abandoned (its compilers killed)."""
    workers = max(1, min(jobs or machine_cores(), len(subjects) or 1))
    if observer is not None:
        observer.steps_begin(what, len(subjects), workers, doing)

    def judged(subject: Subject) -> list[Finding]:
        if observer is not None:
            observer.step_started(subject.label)
        try:
            return subject.check()
        finally:
            if observer is not None:
                observer.step_finished(subject.label)

    try:
        if workers == 1:
            for subject in subjects:
                yield judged(subject)
            return
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hz-static")
        tools = ToolGroups()
        done = False
        try:
            # each subject in a copy of this thread's context (`toolchain.skipping` reaches it)
            # with this phase's tool scope current
            with tools.current():
                futures = [pool.submit(contextvars.copy_context().run, judged, subject) for subject in subjects]
            for future in futures:
                yield future.result()
            done = True
        finally:
            if not done:
                pool.shutdown(wait=False, cancel_futures=True)
                tools.kill()
            pool.shutdown(wait=True)
    finally:
        if observer is not None:
            observer.steps_end()


def path_subjects(paths: Iterable[Path], expand: asm_lint.Expander | None = None) -> list[Subject]:
    """One subject per user path (a missing one is a UserError now, before anything runs)."""
    out = []
    for p in paths:
        if not Path(p).exists():
            raise UserError(f"no such file or directory: {p}")
        out.append(Subject(str(p), lambda p=Path(p): check_path(p, expand)))
    return out


def check_paths(paths: Iterable[Path], expand: asm_lint.Expander | None = None) -> list[Finding]:
    """Every check that applies to each path (file or directory). Bad paths raise
    `UserError`; a missing disassembler is a `toolchain-missing` finding (an error: the
    check could not look), or `check-skipped` under `--skip`. `expand` preprocesses sources
    whose asm templates need it (the lint)."""
    found: list[Finding] = []
    for p in paths:
        found += check_path(Path(p), expand)
    return found


def check_path(path: Path, expand: asm_lint.Expander | None = None) -> list[Finding]:
    """The checks that apply to one user path (file or directory)."""
    if not path.exists():
        raise UserError(f"no such file or directory: {path}")
    if path.is_dir():
        report = asm_lint.lint_report([path], expand=expand)
        out, others = report.findings, 0
        for f in sorted(path.rglob("*")):
            if any(part in asm_lint.SKIP_DIRS for part in f.parts):
                continue
            if f.suffix in LISTING_SUFFIXES or f.name.endswith(LAYOUT_SUFFIXES):
                out += check_file(f)
                others += 1
        if not report.files and not others:  # nothing looked at must not read as a pass
            raise UserError(f"nothing to check under {path}: no C/C++/CUDA/HIP source, listing "
                            f"(.s, .sass, .cubin) or barrier layout")
        return out
    return check_file(path, expand)


def check_file(path: Path, expand: asm_lint.Expander | None = None) -> list[Finding]:
    """The checks for one file, chosen by its suffix."""
    suffix = path.suffix
    if suffix in asm_lint.SOURCE_SUFFIXES:
        return asm_lint.lint_paths([path], expand=expand)
    if suffix in (".toml", ".json"):
        from hazards.static import layout

        return layout.check_layout_file(path)
    kind = LISTING_SUFFIXES.get(suffix)
    if kind == "amdgcn":
        from hazards.static import amdgcn

        return amdgcn.check_listing(path.read_text(errors="replace"), str(path))
    if kind in ("sass", "cubin"):
        from hazards.static import sass

        from hazards.static.compile import ToolKilled

        try:
            return sass.check_cubin(path) if kind == "cubin" else sass.check_sass(
                path.read_text(errors="replace"), str(path))
        except ToolchainMissing as e:
            return [checks.could_not_look(str(path), "SASS checks", e)]
        except ToolKilled as e:  # this file not judged; the other paths and the catalog still are
            return [checks.tool_killed(str(path), "SASS checks could not run", e)]
    raise UserError(f"don't know which static check applies to {path} (expected a C/C++/CUDA/"
                    f"HIP source, .s, .sass, .cubin, .toml or .json)")
