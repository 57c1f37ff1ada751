"""`hazards static`: every static check, on the catalog's families and the given artifacts.

With the compiled mode for a user's own sources."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import (ARCH_HELP, CompileCommandsOption, DefineOption, FamiliesOption,
                                 Hip6CompatOption, IncludeOption, JsonOption, ProgressIntervalOption,
                                 RocmPathOption, SkipOption, VerboseOption, build_flags, parse_skip,
                                 print_findings, progress_interval, split_names, use_hip6_compat,
                                 use_rocm_path)

_HELP = """Run every static check on the catalog's families and on the given paths.

The catalog's families are compiled for real with clang-19 / nvcc: every broken variant must
be flagged, every fixed one clean. Paths: sources get the asm lint, `.s` the AMDGCN checks,
`.sass`/`.cubin` the SASS checks, `.toml`/`.json` the barrier-layout checks. A check that
cannot run because clang-19, nvcc or the disassembler is missing is reported by name with
how to install it, never as passed; `--skip TOOL` says not to use that tool (what needs it
is reported as skipped). `-v` also prints info findings. Builds run in parallel, up to the
machine's cores; progress (what is compiling, n of m, the time left) goes to stderr: a live
display in a terminal, else one status line every `--progress-interval`.

Exit status: 0 every check ran and passed; 1 an error or warning (with `--fail-on-perf` also a
performance finding), or a canary nothing flagged; 2 bad input (a family name that matches
nothing); 3 a check could not run (a missing tool that `--skip` does not name), or nothing
was judged at all (every check skipped by `--skip`).

Compiled mode, for your own sources: `hazards static --compile FILE [-- FLAGS]` or
`hazards static --compile-commands build/compile_commands.json` compiles them with their
flags and the installed headers (`--rocm-path` / `ROCM_PATH`: your ROCm's; `--hip6-compat`:
stand-ins for what ROCm 6 code needs from an older HIP) - for gfx942
with clang-19 or gfx950 with clang-22 (HIP sources) and/or sm_90a with nvcc (CUDA sources;
`--arch` picks) - and runs every AMDGCN/SASS check on what came out, at the source lines,
and says per build what it covered: device functions compiled, asm blocks and polls
checked. A device function with asm, atomics, volatile accesses, fences or loops that left
no code in the output (never instantiated, never called) is `not-analysed`: an error that
exits 3 (could not judge), never a silent pass. The catalog is not run then.
"""


def _flags_after_double_dash() -> list[str]:
    """The compiler flags given after `--` (click hands them to the path argument)."""
    return sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []


@app.command("static", help=_HELP)
def static_command(
    paths: Optional[List[Path]] = typer.Argument(None, show_default="none", help="Extra sources, listings, layouts."),
    no_catalog: bool = typer.Option(False, "--no-catalog", help="Skip the catalog's families."),
    families: FamiliesOption = None,
    skip: SkipOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
    fail_on_perf: bool = typer.Option(False, "--fail-on-perf", help="Performance findings fail too."),
    compile_files: Optional[List[Path]] = typer.Option(
        None, "--compile", help="Compile this source with the flags after `--` and check the output (repeat).",
        show_default="none"),
    compile_commands: CompileCommandsOption = None,
    archs: Optional[List[str]] = typer.Option(
        None, "--arch", help=ARCH_HELP,
        show_default="from the source (HIP: gfx942, CUDA: sm_90a) or its compile command"),
    includes: IncludeOption = None,
    defines: DefineOption = None,
    rocm_path: RocmPathOption = None,
    hip6_compat: Hip6CompatOption = False,
    progress_every: ProgressIntervalOption = "30s",
) -> None:
    from hazards.cli.progress import CampaignProgress
    from hazards.static import compiled
    from hazards.static.runner import Subject
    from hazards.static.userbuild import CompileDatabase, preprocessor_for
    from hazards.static_catalog import could_not_look, run_static_checks, static_exit_code

    _, tools = parse_skip(skip, parts=())
    use_rocm_path(rocm_path)
    use_hip6_compat(hip6_compat)
    interval_s = progress_interval(progress_every)
    t0 = time.monotonic()
    flags = _flags_after_double_dash()
    paths = list(paths or [])[:len(paths or []) - len(flags)] if flags else list(paths or [])
    flags = build_flags(includes, defines) + flags
    archs = split_names(archs)
    jobs = []
    if compile_commands is not None:
        jobs = compiled.jobs_from_database(CompileDatabase.load(compile_commands), compile_files or (), archs)
    elif compile_files:
        jobs = compiled.jobs_for_files(compile_files, flags, archs)
    builds = [Subject(f"{job.source} for {job.arch}", lambda job=job: compiled.check_jobs([job])) for job in jobs]
    with CampaignProgress(interval_s=interval_s) as progress:
        findings = run_static_checks(paths, catalog=not (no_catalog or jobs), families=split_names(families) or None,
                                     skip=tools, expand=preprocessor_for(flags, compile_commands), builds=builds,
                                     observer=progress)
    print_findings(findings, as_json, verbose)
    if not (as_json or verbose):  # what each build covered, like the lint's summary (-v prints it above)
        for f in findings:
            if f.check == "coverage":
                typer.echo(f"coverage: {f.message}", err=True)
    code = static_exit_code(findings, fail_on_perf=fail_on_perf)
    bad = [f for f in findings if (f.fails or (fail_on_perf and f.severity == "perf"))]
    blind = could_not_look(findings)
    detected = sum(1 for f in findings if f.check == "canary-detected")
    skipped = sum(1 for f in findings if f.check == "check-skipped")
    built = f", {len(jobs)} compiled source build(s)" if jobs else ""
    typer.echo(f"hazards static: {len(bad) - len(blind)} failing finding(s), {detected} canaries detected{built}, "
               f"{len(blind)} check(s) could not run, {skipped} skipped, {time.monotonic() - t0:.1f} s", err=True)
    if not findings.judged:
        typer.echo("hazards static judged nothing: every check was skipped (--skip) or could not run", err=True)
    sys.exit(code)
