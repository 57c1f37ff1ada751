"""`hazards lint`: the inline-asm source lint."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List

import typer

from hazards.cli.app import app
from hazards.cli.options import (CompileCommandsOption, DefineOption, IncludeOption, JsonOption,
                                 RocmPathOption, VerboseOption, build_flags, print_findings, use_rocm_path)

_HELP = """Lint inline asm in C/C++/CUDA/HIP sources (files or directories).

Flags every asm block where an output without early-clobber (`"=v"`, or a `"+v"` operand
whose value is uninitialised or equal to an input) may be written before an instruction
that runs after it - later, or around an asm-written loop - reads an input (the MI355
megakernel PR's four-load block). Templates in raw string literals are read; templates
built through function-like macros are expanded with `clang -E` and the build's flags
(the nearest compile_commands.json, or -I/-D). Prints file:line, the reason and the block,
then how many asm blocks were checked and skipped and why (per file with -v). Exit status: 1
when anything is found; else 3 when macro-built blocks could not be expanded because
clang-19 is not installed (`--no-expand` skips them instead); else 0. Silence a reviewed block with a comment on its lines or the line above:
`// hazards: allow(early-clobber) <reason>`.
"""


@app.command("lint", help=_HELP)
def lint_command(
    paths: List[Path] = typer.Argument(..., help="Source files or directories."),
    as_json: JsonOption = False,
    no_allowlist: bool = typer.Option(False, "--no-allowlist", help="Ignore allow comments."),
    includes: IncludeOption = None,
    defines: DefineOption = None,
    compile_commands: CompileCommandsOption = None,
    rocm_path: RocmPathOption = None,
    no_expand: bool = typer.Option(False, "--no-expand", help="Never run the preprocessor: "
                                   "templates built from macros are reported as not checked."),
    verbose: VerboseOption = False,
) -> None:
    from hazards.static.asm_lint import lint_report
    from hazards.static_catalog import could_not_look, static_exit_code
    from hazards.static.userbuild import preprocessor_for

    t0 = time.monotonic()
    use_rocm_path(rocm_path)
    expand = None if no_expand else preprocessor_for(build_flags(includes, defines), compile_commands)
    report = lint_report(paths, honor_allowlist=not no_allowlist, expand=expand)
    if not report.files:  # nothing looked at must not read as a pass
        from hazards.engine.errors import UserError

        raise UserError(f"no C/C++/CUDA/HIP source under {', '.join(map(str, paths))}: nothing to lint")
    print_findings(report.findings, as_json, True)
    if verbose:
        for r in (r for r in report.files if r.blocks):
            why = ", ".join(f"{n} {k}" for k, n in sorted(r.skipped.items()))
            typer.echo(f"{r.path}: {r.blocks} asm block(s), {r.checked} checked, "
                       f"{sum(r.skipped.values())} skipped" + (f" ({why})" if why else ""), err=True)
    blind = could_not_look(report.findings)
    bad = [f for f in report.findings if f.fails and f not in blind]
    typer.echo(f"hazards lint: {len(bad)} finding(s); {report.summary()}"
               + (f"; {len(blind)} file(s) could not be fully checked (a tool is missing)" if blind else "")
               + f"; {time.monotonic() - t0:.2f} s", err=True)
    sys.exit(static_exit_code(report.findings))
