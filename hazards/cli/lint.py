"""`hazards lint`: the inline-asm source lint."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List

import typer

from hazards.cli.app import app
from hazards.cli.options import JsonOption, print_findings

_HELP = """Lint inline asm in C/C++/CUDA/HIP sources (files or directories).

Flags every asm block with two or more instructions whose register outputs are not
early-clobber where an output may be written before a later instruction reads an input (the
MI355 megakernel PR's four-load block). Prints file:line, the reason and the block; exits 1
when anything is found. Silence a reviewed block with a comment on its lines or the line
above: `// hazards: allow(early-clobber) <reason>`.
"""


@app.command("lint", help=_HELP)
def lint_command(
    paths: List[Path] = typer.Argument(..., help="Source files or directories."),
    as_json: JsonOption = False,
    no_allowlist: bool = typer.Option(False, "--no-allowlist", help="Ignore allow comments."),
) -> None:
    from hazards.static.asm_lint import iter_sources, lint_paths

    t0 = time.monotonic()
    findings = lint_paths(paths, honor_allowlist=not no_allowlist)
    print_findings(findings, as_json, True)
    n_files = sum(1 for _ in iter_sources(paths))
    bad = [f for f in findings if f.fails]
    typer.echo(f"hazards lint: {len(bad)} finding(s) in {n_files} source file(s), "
               f"{time.monotonic() - t0:.2f} s", err=True)
    sys.exit(1 if bad else 0)
