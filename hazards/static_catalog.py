"""The catalog's static canaries: every static family compiled and judged, variant by variant.

Each family with a static check (`Family.static_check(params) -> list[Finding]`, given by its
module in `hazards/families/`) is compiled and checked variant by variant with the artifact checks of `hazards.static`. A
broken variant (canary) must be flagged - by every check id its `Family.predicted_checks` names;
if nothing fires, the check "went blind" and that is reported as an error; a
reference/fixed variant must be clean - anything it triggers is reported as found. A
variant whose checks could not run (a compiler or disassembler is missing) is reported by
name as `toolchain-missing` (an error that is not a hazard: the commands exit 3), never as
passed; `--skip TOOL` turns that into a `check-skipped` note. Findings
of a canary that was flagged are expected: they are summarised as one `canary-detected`
info line, not failures. More in docs/static-checks.md.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterable, Iterator

from hazards.engine.errors import ToolchainMissing, UserError
from hazards.family import Family, Variant
from hazards.static import checks
from hazards.static.checks import Check
from hazards.static.compile import ToolKilled
from hazards.static.findings import Finding, with_subject
from hazards.static.runner import StepObserver, Subject, path_subjects, run_subjects

CANARY_BLIND = Check(
    "canary-blind", "error", "catalog",
    "a broken variant the static checks it claims did not flag: the check went blind")
CANARY_DETECTED = Check(
    "canary-detected", "info", "catalog", "a broken variant flagged as expected (by which ids)")
MODEL_DISAGREES = Check(
    "model-disagrees", "error", "catalog",
    "a family's static model disagrees with a variant's role")
CATALOG_CHECKS: tuple[Check, ...] = (CANARY_BLIND, CANARY_DETECTED, MODEL_DISAGREES)


class StaticFindings(list):
    """A static run's findings, and `judged`: how many subjects (catalog variants, user
    paths, compiled builds) at least one check looked at. 0 means the run judged nothing,
    which never reads as a pass (`static_exit_code`), whatever `--skip` named."""

    judged = 0

    def add(self, found: list[Finding]) -> None:
        """The findings of one subject: judged unless they are all blind spots (a check
        skipped or missing), none at all meaning every check looked and found nothing."""
        self.extend(found)
        self.judged += not found or any(f.check not in BLIND_SPOTS for f in found)


def run_static_checks(paths: list[Path] | None = None, *, catalog: bool = True,
                      families: Iterable[str] | None = None, skip: Iterable[str] = (),
                      expand=None, builds: Iterable[Subject] = (), jobs: int | None = None,
                      observer: StepObserver | None = None) -> StaticFindings:
    """Run every static check over the catalog (unless `catalog=False`), over `paths`
    (`expand`: the lint's macro expander for the sources among them) and `builds` (the
    compiled mode's), up to `jobs` subjects at once (default: the machine's cores), telling
    `observer` what is being judged (`hazards.static.runner.run_subjects`).

    Returns all findings; those with `.fails` (errors, warnings) mean the check failed. Bad
    paths and family names that match nothing raise `UserError`. A check that could not run
    for a missing compiler or disassembler is a `toolchain-missing` error naming it (the
    variant it was to judge, how to install it); the tools named in `skip` (keys of
    `hazards.engine.toolchain.TOOLS`) are not used at all, and what needs them is a
    `check-skipped` info finding instead.
    """
    from hazards.engine import toolchain

    found = StaticFindings()
    subjects = [*(_catalog_subjects(families) if catalog else ()), *path_subjects(paths or (), expand), *builds]
    with toolchain.skipping(skip):
        for findings in run_subjects(subjects, jobs=jobs, observer=observer):
            found.add(findings)
    return found


def static_family_names() -> list[str]:
    """The families the catalog's static checks judge (a `static_check`, or a static canary)."""
    from hazards.families import all_families

    return [f.name for f in all_families()
            if f.static_check is not None or any("static" in v.detected_by for v in f.canaries)]


def _static_families(families: Iterable[str] | None) -> Iterator[Family]:
    from hazards.families import all_families

    wanted = set(families or ())
    static = set(static_family_names())
    if wanted - static:
        known = {f.name for f in all_families()}
        name = sorted(wanted - static)[0]
        what = "has no static checks" if name in known else "is not a family"
        raise UserError(f"{name!r} {what} (families with static checks: {', '.join(sorted(static))})")
    for fam in all_families():
        if (wanted and fam.name not in wanted) or fam.name not in static:
            continue
        yield fam


def check_catalog(families: Iterable[str] | None = None) -> list[Finding]:
    """Compile and check every variant of every family that has a static check; an AMD
    family (`Family.static_archs`) on each of those targets' listings, the
    subject of a target other than the first naming it (`earlyclobber/broken@gfx950`)."""
    return [f for findings in run_subjects(list(_catalog_subjects(families))) for f in findings]


def _catalog_subjects(families: Iterable[str] | None) -> Iterator[Subject]:
    """Each catalog variant on each AMD target as a subject to judge (of a family claiming
    static detection without a static check: its blind canaries)."""
    for fam in _static_families(families):
        src = str(fam.source_path)
        claims = [v for v in fam.canaries if "static" in v.detected_by]
        if fam.static_check is None:
            for v in claims:
                blind = [CANARY_BLIND.finding(
                    src, 0, f"{v.name} claims static detection but family {fam.name} "
                            f"defines no static_check", subject=f"{fam.name}/{v.name}")]
                yield Subject(f"{fam.name}/{v.name}", lambda blind=blind: blind)
            continue
        archs = fam.static_archs
        targets = fam.static_targets or (lambda params, archs=archs: archs)  # a point's buildable targets
        for arch in archs:
            for v in fam.variants:
                if arch not in targets({"variant": v.name}):
                    continue
                primary = arch == archs[0]
                yield Subject(f"{fam.name}/{v.name}" + ("" if primary else f"@{arch}"),
                              functools.partial(_check_variant, fam, v, arch, primary=primary))


BLIND_SPOTS = (checks.TOOLCHAIN_MISSING.id, checks.CHECK_SKIPPED.id, checks.TOOL_KILLED.id)  # could not look


def _check_variant(fam: Family, v: Variant, arch: str | None = None, *, primary: bool = True) -> list[Finding]:
    subject, src = f"{fam.name}/{v.name}" + ("" if primary else f"@{arch}"), str(fam.source_path)
    on_target = {"arch": arch} if arch else {}
    try:
        found = fam.static_check({"variant": v.name}, **on_target)
    except ToolchainMissing as e:
        return [checks.could_not_look(src, f"static checks of {subject}", e, subject=subject)]
    except ToolKilled as e:  # this subject not judged; the others still are
        return [checks.tool_killed(src, f"static checks of {subject} could not run", e, subject=subject)]
    out: list[Finding] = []
    verdict = fam.static_model({"variant": v.name})
    if verdict.hazardous != v.is_canary:
        out.append(MODEL_DISAGREES.finding(
            src, 0, f"the static model says hazardous={verdict.hazardous} ({verdict.reason}) "
                    f"for a {v.role} variant", subject=subject))
    blind_spots = with_subject([f for f in found if f.check in BLIND_SPOTS], subject)
    failing = [f for f in found if f.fails and f.check not in BLIND_SPOTS]
    if not v.is_canary:
        return out + with_subject(failing, subject) + blind_spots
    if "static" not in v.detected_by:
        return out + blind_spots
    expected = (set(fam.predicted_checks({"variant": v.name}, **on_target))
                if fam.predicted_checks is not None else set())
    if not primary and not expected and not failing:
        # no signature on this target's listing (an NVIDIA-only hazard, judged with the first)
        return out + blind_spots
    for check_id in expected:
        checks.get(check_id)  # a family naming an unregistered id is a bug, not a blind check
    got = {f.check for f in failing}
    if not failing or (expected and not expected <= got):
        if blind_spots:  # part of the checks could not look: not judged, never "went blind"
            return out + blind_spots
        missing = ", ".join(sorted(expected - got)) or "any check"
        out.append(CANARY_BLIND.finding(
            src, 0, f"broken variant not flagged by {missing} (found: "
                    f"{', '.join(sorted(got)) or 'nothing'}): the check went blind",
            subject=subject))
    else:
        first = failing[0]
        out.append(CANARY_DETECTED.finding(first.path, first.line,
                                           f"detected by {', '.join(sorted(got))}",
                                           subject=subject))
    return out + blind_spots


# Findings that say a check could not look: a tool missing (not skipped), a user's source
# that did not compile in the compiled mode, a device function that left no code to check,
# a compiler ended by a signal.
NOT_JUDGED = (checks.TOOLCHAIN_MISSING.id, checks.COMPILE_FAILED.id, checks.NOT_ANALYSED.id, checks.TOOL_KILLED.id)


def could_not_look(findings: Iterable[Finding]) -> list[Finding]:
    """The findings that say a check could not look (a tool missing, not skipped; a user's
    source that did not compile; a compiler ended by a signal)."""
    return [f for f in findings if f.check in NOT_JUDGED]


def static_exit_code(findings: Iterable[Finding], *, fail_on_perf: bool = False) -> int:
    """1 for any failing finding that is a hazard (or a blind canary), else 3 when a check
    could not look (a missing tool, a source that did not compile) or a `StaticFindings`
    run judged nothing (every check skipped by name), else 0."""
    from hazards.engine.errors import EXIT_HAZARD, EXIT_NOT_JUDGED, EXIT_OK

    judged_nothing = getattr(findings, "judged", None) == 0
    findings = list(findings)
    if any((f.fails or (fail_on_perf and f.severity == "perf")) and f.check not in NOT_JUDGED
           for f in findings):
        return EXIT_HAZARD
    return EXIT_NOT_JUDGED if could_not_look(findings) or judged_nothing else EXIT_OK


def checks_table() -> str:
    """The table of every check id (artifact checks, then the catalog's), for the docs."""
    return checks.markdown_table([*checks.REGISTRY.values(), *CATALOG_CHECKS])
