"""The catalog's static canaries: every static family compiled and judged, variant by variant.

Each family module in `hazards/families/` that defines `static_check(params) -> list[Finding]`
is compiled and checked variant by variant with the artifact checks of `hazards.static`. A
broken variant (canary) must be flagged - by every check id its `predicted_checks` names;
if nothing fires, the check "went blind" and that is reported as an error; a
reference/fixed variant must be clean - anything it triggers is reported as found. Findings
of a canary that was flagged are expected: they are summarised as one `canary-detected`
info line, not failures.

This module is the catalog side of the static checks: `hazards.static` checks artifacts
and imports nothing from the catalog; the catalog's verdicts about its own variants live
here, with their ids in `CATALOG_CHECKS`.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Iterable

from hazards.engine.errors import ToolchainMissing
from hazards.static import checks
from hazards.static.checks import Check
from hazards.static.findings import Finding, with_subject
from hazards.static.runner import check_paths

CANARY_BLIND = Check(
    "canary-blind", "error", "catalog",
    "a broken variant the static checks it claims did not flag: the check went blind")
CANARY_DETECTED = Check(
    "canary-detected", "info", "catalog", "a broken variant flagged as expected (by which ids)")
MODEL_DISAGREES = Check(
    "model-disagrees", "error", "catalog",
    "a family's static model disagrees with a variant's role")
CATALOG_CHECKS: tuple[Check, ...] = (CANARY_BLIND, CANARY_DETECTED, MODEL_DISAGREES)


def run_static_checks(paths: list[Path] | None = None, *, catalog: bool = True,
                      families: Iterable[str] | None = None) -> list[Finding]:
    """Run every static check over the catalog (unless `catalog=False`) and over `paths`.

    Returns all findings; those with `.fails` (errors, warnings) mean the check failed.
    Bad paths raise `UserError`; a missing compiler turns into an `info` finding saying
    which checks were skipped and why.
    """
    found: list[Finding] = []
    if catalog:
        found += check_catalog(families)
    return found + check_paths(paths or ())


def _static_modules(families: Iterable[str] | None):
    from hazards.families import all_families

    wanted = set(families or ())
    for fam in all_families():
        if wanted and fam.name not in wanted:
            continue
        mod = importlib.import_module(f"hazards.families.{fam.name}")
        yield fam, mod, getattr(mod, "static_check", None)


def check_catalog(families: Iterable[str] | None = None) -> list[Finding]:
    """Compile and check every variant of every family that has a static check."""
    out: list[Finding] = []
    for fam, mod, static_check in _static_modules(families):
        src = str(fam.source_path)
        claims = [v for v in fam.canaries if "static" in v.detected_by]
        if static_check is None:
            for v in claims:
                out.append(CANARY_BLIND.finding(
                    src, 0, f"{v.name} claims static detection but family {fam.name} "
                            f"defines no static_check", subject=f"{fam.name}/{v.name}"))
            continue
        for v in fam.variants:
            out += _check_variant(fam, mod, static_check, v)
    return out


def _check_variant(fam, mod, static_check, v) -> list[Finding]:
    subject, src = f"{fam.name}/{v.name}", str(fam.source_path)
    try:
        found = static_check({"variant": v.name})
    except ToolchainMissing as e:
        return [checks.TOOLCHAIN_MISSING.finding(src, 0, f"static checks of {subject} skipped: {e}",
                                                 subject=subject)]
    out: list[Finding] = []
    verdict = fam.static_model({"variant": v.name})
    if verdict.hazardous != v.is_canary:
        out.append(MODEL_DISAGREES.finding(
            src, 0, f"the static model says hazardous={verdict.hazardous} ({verdict.reason}) "
                    f"for a {v.role} variant", subject=subject))
    failing = [f for f in found if f.fails]
    if not v.is_canary:
        return out + with_subject(failing, subject)
    if "static" not in v.detected_by:
        return out
    expected = set(mod.predicted_checks({"variant": v.name})) if hasattr(mod, "predicted_checks") else set()
    for check_id in expected:
        checks.get(check_id)  # a family naming an unregistered id is a bug, not a blind check
    got = {f.check for f in failing}
    if not failing or (expected and not expected <= got):
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
    return out


def checks_table() -> str:
    """The table of every check id (artifact checks, then the catalog's), for the docs."""
    return checks.markdown_table([*checks.REGISTRY.values(), *CATALOG_CHECKS])
