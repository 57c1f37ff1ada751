"""`hazards static`: every static check (the catalog's families and the given artifacts)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import FamiliesOption, JsonOption, VerboseOption, print_findings, split_names

_HELP = """Run every static check on the catalog's families and on the given paths.

The catalog's families are compiled for real with clang-19 / nvcc: every broken variant must
be flagged, every fixed one clean. Paths: sources get the asm lint, `.s` the AMDGCN checks,
`.sass`/`.cubin` the SASS checks, `.toml`/`.json` the barrier-layout checks. Exits 1 on any
error or warning (with `--fail-on-perf` also on performance findings); `-v` also prints info
findings.
"""


@app.command("static", help=_HELP)
def static_command(
    paths: Optional[List[Path]] = typer.Argument(None, show_default="none", help="Extra sources, listings, layouts."),
    no_catalog: bool = typer.Option(False, "--no-catalog", help="Skip the catalog's families."),
    families: FamiliesOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
    fail_on_perf: bool = typer.Option(False, "--fail-on-perf", help="Performance findings fail too."),
) -> None:
    from hazards.static_catalog import run_static_checks

    t0 = time.monotonic()
    findings = run_static_checks(paths or [], catalog=not no_catalog, families=split_names(families) or None)
    print_findings(findings, as_json, verbose)
    bad = [f for f in findings if f.fails or (fail_on_perf and f.severity == "perf")]
    detected = sum(1 for f in findings if f.check == "canary-detected")
    typer.echo(f"hazards static: {len(bad)} failing finding(s), {detected} canaries detected, "
               f"{time.monotonic() - t0:.1f} s", err=True)
    sys.exit(1 if bad else 0)
