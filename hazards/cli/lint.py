"""`hazards lint` (inline-asm source lint) and `hazards static` (every static check)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from hazards.cli.app import app

_LINT_HELP = """Lint inline asm in C/C++/CUDA/HIP sources (files or directories).

Flags every asm block with two or more instructions whose register outputs are not
early-clobber where an output may be written before a later instruction reads an input (the
MI355 megakernel PR's four-load block). Prints file:line, the reason and the block; exits 1
when anything is found. Silence a reviewed block with a comment on its lines or the line
above:
`// hazards: allow(early-clobber) <reason>`.
"""

_STATIC_HELP = """Run every static check: the catalog's families (compiled for real with
clang-19 / nvcc; every broken variant must be flagged, every fixed one clean) and the given
paths (sources: asm lint; .s: AMDGCN checks; .sass/.cubin: SASS checks; .toml/.json:
barrier layouts). Exits 1 on any error or warning (with --fail-on-perf also on
performance findings).
"""


def _emit(findings, as_json: bool, show_info: bool) -> None:
    from hazards.static.findings import to_json

    shown = [f for f in findings if show_info or f.severity != "info"]
    if as_json:
        typer.echo(to_json(shown))
        return
    for f in shown:
        typer.echo(f.format())


@app.command("lint", help=_LINT_HELP)
def lint_command(
    paths: List[Path] = typer.Argument(..., help="Source files or directories."),
    as_json: bool = typer.Option(False, "--json", help="Print findings as a JSON array."),
    no_allowlist: bool = typer.Option(False, "--no-allowlist", help="Ignore allow comments."),
) -> None:
    from hazards.static.asm_lint import iter_sources, lint_paths

    t0 = time.monotonic()
    findings = lint_paths(paths, honor_allowlist=not no_allowlist)
    _emit(findings, as_json, True)
    n_files = sum(1 for _ in iter_sources(paths))
    bad = [f for f in findings if f.fails]
    typer.echo(f"hazards lint: {len(bad)} finding(s) in {n_files} source file(s), "
               f"{time.monotonic() - t0:.2f} s", err=True)
    sys.exit(1 if bad else 0)


@app.command("static", help=_STATIC_HELP)
def static_command(
    paths: Optional[List[Path]] = typer.Argument(None, help="Extra sources, listings, layouts."),
    no_catalog: bool = typer.Option(False, "--no-catalog", help="Skip the catalog's families."),
    families: Optional[List[str]] = typer.Option(None, "--families", help="Only these families."),
    as_json: bool = typer.Option(False, "--json", help="Print findings as a JSON array."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Also print info findings."),
    fail_on_perf: bool = typer.Option(False, "--fail-on-perf", help="Performance findings fail too."),
) -> None:
    from hazards.static_catalog import run_static_checks

    names = [n.strip() for v in families or () for n in v.split(",") if n.strip()]
    t0 = time.monotonic()
    findings = run_static_checks(paths or [], catalog=not no_catalog, families=names or None)
    _emit(findings, as_json, verbose)
    bad = [f for f in findings if f.fails or (fail_on_perf and f.severity == "perf")]
    detected = sum(1 for f in findings if f.check == "canary-detected")
    typer.echo(f"hazards static: {len(bad)} failing finding(s), {detected} canaries detected, "
               f"{time.monotonic() - t0:.1f} s", err=True)
    sys.exit(1 if bad else 0)
