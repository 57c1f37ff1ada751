"""`hazards static`: every static check (the catalog's families and the given artifacts)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import (FamiliesOption, JsonOption, SkipOption, VerboseOption, parse_skip, print_findings,
                                 split_names)

_HELP = """Run every static check on the catalog's families and on the given paths.

The catalog's families are compiled for real with clang-19 / nvcc: every broken variant must
be flagged, every fixed one clean. Paths: sources get the asm lint, `.s` the AMDGCN checks,
`.sass`/`.cubin` the SASS checks, `.toml`/`.json` the barrier-layout checks. A check that
cannot run because clang-19, nvcc or the disassembler is missing is reported by name with
how to install it, never as passed; `--skip TOOL` says not to use that tool (what needs it
is reported as skipped). `-v` also prints info findings.

Exit status: 0 every check ran and passed; 1 an error or warning (with `--fail-on-perf` also a
performance finding), or a canary nothing flagged; 2 bad input (a family name that matches
nothing); 3 a check could not run (a missing tool that `--skip` does not name).
"""


@app.command("static", help=_HELP)
def static_command(
    paths: Optional[List[Path]] = typer.Argument(None, show_default="none", help="Extra sources, listings, layouts."),
    no_catalog: bool = typer.Option(False, "--no-catalog", help="Skip the catalog's families."),
    families: FamiliesOption = None,
    skip: SkipOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
    fail_on_perf: bool = typer.Option(False, "--fail-on-perf", help="Performance findings fail too."),
) -> None:
    from hazards.static_catalog import could_not_look, run_static_checks, static_exit_code

    _, tools = parse_skip(skip, parts=())
    t0 = time.monotonic()
    findings = run_static_checks(paths or [], catalog=not no_catalog, families=split_names(families) or None,
                                 skip=tools)
    print_findings(findings, as_json, verbose)
    code = static_exit_code(findings, fail_on_perf=fail_on_perf)
    bad = [f for f in findings if (f.fails or (fail_on_perf and f.severity == "perf"))]
    blind = could_not_look(findings)
    detected = sum(1 for f in findings if f.check == "canary-detected")
    skipped = sum(1 for f in findings if f.check == "check-skipped")
    typer.echo(f"hazards static: {len(bad) - len(blind)} failing finding(s), {detected} canaries detected, "
               f"{len(blind)} check(s) could not run, {skipped} skipped, {time.monotonic() - t0:.1f} s", err=True)
    sys.exit(code)
