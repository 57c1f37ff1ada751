"""The static checks that apply to a user's paths, chosen by file kind: `check_paths`.

C/C++/CUDA/HIP sources get the inline-asm source lint; `.s` listings the AMDGCN checks;
`.sass` listings and `.cubin` files the NVIDIA SASS checks; `.toml` / `.json` files (in a
directory: `*.layout.toml` / `*.layout.json`) the barrier-layout check. The catalog's own
families are checked by `hazards.static_catalog`, which builds on this module.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from hazards.static import asm_lint, checks
from hazards.static.findings import Finding
from hazards.engine.errors import ToolchainMissing, UserError

LISTING_SUFFIXES = {".s": "amdgcn", ".sass": "sass", ".cubin": "cubin"}
LAYOUT_SUFFIXES = (".layout.toml", ".layout.json")


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

        try:
            return sass.check_cubin(path) if kind == "cubin" else sass.check_sass(
                path.read_text(errors="replace"), str(path))
        except ToolchainMissing as e:
            return [checks.could_not_look(str(path), "SASS checks", e)]
    raise UserError(f"don't know which static check applies to {path} (expected a C/C++/CUDA/"
                    f"HIP source, .s, .sass, .cubin, .toml or .json)")
