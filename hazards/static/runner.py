"""Every static check, over the catalog and over user paths: `run_static_checks`.

Catalog: each family module in `hazards/families/` that defines
`static_check(params) -> list[Finding]` is compiled and checked variant by variant. A
broken variant (canary) must be flagged - if nothing fires, the check "went blind" and that
is reported as an error; a reference/fixed variant must be clean - anything it triggers is
reported as found. Findings of a canary that was flagged are expected: they are summarised
as one `canary-detected` info line, not failures.

User paths, by kind: C/C++/CUDA/HIP sources get the inline-asm source lint; `.s` listings
the AMDGCN checks; `.sass` listings and `.cubin` files the NVIDIA SASS checks; `.toml` /
`.json` files (in a directory: `*.layout.toml` / `*.layout.json`) the barrier-layout check.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Iterable

from hazards.static import asm_lint
from hazards.static.findings import Finding, with_subject
from hazards.engine.errors import ToolchainMissing, UserError

LISTING_SUFFIXES = {".s": "amdgcn", ".sass": "sass", ".cubin": "cubin"}
LAYOUT_SUFFIXES = (".layout.toml", ".layout.json")


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
    for p in paths or ():
        found += check_path(Path(p))
    return found


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
                out.append(Finding("canary-blind", "error", src, 0,
                                   f"{v.name} claims static detection but family {fam.name} "
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
        return [Finding("toolchain-missing", "info", src, 0,
                        f"static checks of {subject} skipped: {e}", subject=subject)]
    out: list[Finding] = []
    verdict = fam.static_model({"variant": v.name})
    if verdict.hazardous != v.is_canary:
        out.append(Finding("model-disagrees", "error", src, 0,
                           f"the static model says hazardous={verdict.hazardous} "
                           f"({verdict.reason}) for a {v.role} variant", subject=subject))
    failing = [f for f in found if f.fails]
    if not v.is_canary:
        return out + with_subject(failing, subject)
    if "static" not in v.detected_by:
        return out
    expected = set(mod.predicted_checks({"variant": v.name})) if hasattr(mod, "predicted_checks") else set()
    got = {f.check for f in failing}
    if not failing or (expected and not expected <= got):
        missing = ", ".join(sorted(expected - got)) or "any check"
        out.append(Finding("canary-blind", "error", src, 0,
                           f"broken variant not flagged by {missing} (found: "
                           f"{', '.join(sorted(got)) or 'nothing'}): the check went blind",
                           subject=subject))
    else:
        first = failing[0]
        out.append(Finding("canary-detected", "info", first.path, first.line,
                           f"detected by {', '.join(sorted(got))}", subject=subject))
    return out


def check_path(path: Path) -> list[Finding]:
    """The checks that apply to one user path (file or directory)."""
    if not path.exists():
        raise UserError(f"no such file or directory: {path}")
    if path.is_dir():
        out = asm_lint.lint_paths([path])
        for f in sorted(path.rglob("*")):
            if any(part in asm_lint.SKIP_DIRS for part in f.parts):
                continue
            if f.suffix in LISTING_SUFFIXES or f.name.endswith(LAYOUT_SUFFIXES):
                out += check_file(f)
        return out
    return check_file(path)


def check_file(path: Path) -> list[Finding]:
    """The checks for one file, chosen by its suffix."""
    suffix = path.suffix
    if suffix in asm_lint.SOURCE_SUFFIXES:
        return asm_lint.lint_paths([path])
    if suffix in (".toml", ".json"):
        from hazards.static import layout

        return layout.check_layout_file(path)
    kind = LISTING_SUFFIXES.get(suffix)
    if kind == "amdgcn":
        from hazards.static import amdgcn

        return amdgcn.check_listing(path.read_text(errors="replace"), str(path))
    if kind in ("sass", "cubin"):
        from hazards.static import sass

        try:
            return sass.check_cubin(path) if kind == "cubin" else sass.check_sass(
                path.read_text(errors="replace"), str(path))
        except ToolchainMissing as e:
            return [Finding("toolchain-missing", "info", str(path), 0, f"SASS checks skipped: {e}")]
    raise UserError(f"don't know which static check applies to {path} (expected a C/C++/CUDA/"
                    f"HIP source, .s, .sass, .cubin, .toml or .json)")
