"""`hazards mutate`: synchronization mutants of a source, and whether a test sees them."""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import (BuildOption, FamilyOption, BudgetOption, DefineOption, JsonOption, LeaseFlags, launches_option, lease_options,
                                 parse_define_items, parse_duration, parse_undefine_items, runs_option, timeout_option, variant_option)
from hazards.engine.errors import EXIT_HAZARD, EXIT_NOT_JUDGED, EXIT_OK, UserError, check_seconds

_HELP = """Would a stress test see a missing fence? Synchronization mutants of a source.

Each mutant weakens one synchronization point: a fence removed, a memory order weakened to
relaxed, a scope narrowed, a barrier removed, an async wait deepened by one, an early-clobber
dropped, a flag store moved before the data it publishes, an s_nop shortened. Sites are found
on the text the compiler sees: comments and strings are left alone, and the preprocessor
(nvcc, clang or cpp, whichever is installed; `-D`/`-U` reach it) decides which branches are
live, a macro expanding to a fence or barrier counting at its use sites; without one, the
text scanner decides, with a note. `--list` prints every mutant (id, line, description;
`--json` adds its diff) and builds nothing.

With `--test`, each mutant is written into a scratch copy of `--root` (never into your files),
built with `--build`, judged by the early-clobber lint, then run with `--test` through the
engine until it fails or its share of `--budget` ends. `{dir}` is the mutant's copy of the
root, `{src}` its mutated file, `{out}` a folder for build output. A mutant is killed-static,
killed (with the failing run's evidence), survived (with its per-launch upper bound),
did-not-build, timed-out-build, not-judged or not-run. Exit status: 0 every mutant that built
was killed, 1 a mutant survived, 3 a mutant was left unjudged (not-judged, not-run,
timed-out-build) or none could be judged, 2 bad input. See docs/mutate.md.

    hazards mutate kernel.cu --list
    hazards mutate kernel.cu --build 'nvcc -O3 -arch=sm_90a {src} -o {out}/k' --test '{out}/k --check' --budget 20m
"""


@app.command("mutate", help=_HELP)
@lease_options
def mutate_command(
    sources: Optional[List[Path]] = typer.Argument(
        None, help="C/C++/CUDA/HIP source files to mutate; with --family, which of the family's files.",
        show_default="the family's sources with --family"),
    list_only: bool = typer.Option(False, "--list", help="Print the mutants; build and run nothing."),
    as_json: JsonOption = False,
    operators: Optional[List[str]] = typer.Option(None, "--operators", show_default="all",
                                                  help="Only these operators (repeat or comma-separate)."),
    lines: Optional[str] = typer.Option(None, "--lines", show_default="all", help="Only sites on lines A-B."),
    defines: DefineOption = None,
    undefines: Optional[List[str]] = typer.Option(None, "-U", "--undefine", show_default="none",
                                                  help="A macro the build leaves undefined (repeat or "
                                                       "comma-separate; a name alone): the branches it guards "
                                                       "are then decided."),
    build: BuildOption = None,
    test: Optional[str] = typer.Option(None, "--test", show_default="none (needed without --list)",
                                       help="Shell command whose run judges a mutant ({dir}, {src}, {out})."),
    root: Optional[Path] = typer.Option(None, "--root", show_default="the first source's folder",
                                        help="The folder copied for each mutant (what the build needs)."),
    budget: BudgetOption = "10m",
    timeout: Annotated[float, timeout_option("60")] = 60.0,
    runs: Annotated[int, runs_option("50 per mutant")] = 50,
    jobs: int = typer.Option(0, "--jobs", show_default="the machine's cores", help="Parallel builds."),
    no_static: bool = typer.Option(False, "--no-static", help="Skip the early-clobber lint of each mutant."),
    no_preprocess: bool = typer.Option(False, "--no-preprocess",
                                       help="Find sites with the text scanner alone (run no preprocessor)."),
    family: FamilyOption = None,
    variants: Annotated[Optional[List[str]], variant_option("with --family: every fixed and reference variant")] = None,
    launches: Annotated[int, launches_option("1000")] = 1000,
    lease: LeaseFlags = LeaseFlags(),
) -> None:
    from hazards.mutate.mutants import check_operators, mutants_of, parse_lines

    defs: dict[str, str | None] = dict(parse_define_items(defines))  # -D as repro reads it
    defs.update({name: None for name in parse_undefine_items(undefines)})  # -U split and checked alike
    chosen, span = check_operators(operators), parse_lines(lines)
    language = None  # by suffix: .hip is HIP, the rest CUDA
    if family is not None:
        from hazards.mutate import catalog

        if launches < 1:
            raise UserError(f"--launches must be at least 1, got {launches}")

        tree, files = catalog.subject_files(family, runnable=not list_only)
        if build or test or root:
            raise UserError("--family brings its own --build, --test and --root; give none of them")
        if not list_only:
            build, test = catalog.commands(family, variants or [], launches)
        root, sources = tree, catalog.pick_files(family, files, list(sources or []))
        defs = {**catalog.build_defines(family), **defs}
        language = catalog.language(family)
    elif variants:
        raise UserError("--variant names a variant of --family F: give --family too, or judge with --test")
    if not sources:
        raise UserError("name the source files to mutate (or --family F)")
    if not list_only and not test:
        raise UserError("give --test CMD to judge the mutants (or --list to print them)")
    found, notes = [], []
    for path in sources:
        if not path.is_file():
            raise UserError(f"no source file {path}")
        text, mutants = mutants_of(path, operators=chosen, lines=span, defines=defs, preprocess=not no_preprocess,
                                   language=language, notes=notes)
        found.extend((m, text) for m in mutants)
    for note in notes:  # the one-line note of a fallback to the text scanner, or of headers not found
        if note.incomplete:
            print(f"mutate: note: {note}", file=sys.stderr)
    # A source that is not valid UTF-8 keeps its bytes (surrogateescape): its diffs print them as they are.
    sys.stdout.reconfigure(errors="surrogateescape")
    if list_only:
        _print_list(found, as_json, [str(note) for note in notes])
        sys.exit(EXIT_OK)
    sys.exit(_kill(found, sources, build, test, root, budget, timeout, runs, jobs, not no_static, lease, as_json))


def _print_list(found: list, as_json: bool, how: list[str]) -> None:
    if as_json:
        print(json.dumps({"sites": how, "mutants": [m.as_json(text) for m, text in found]}))
        return
    for m, _ in found:
        print(f"{m.path}:{m.line}  {m.id:24s} {m.description}")
    print(f"{len(found)} mutant(s)")


def _kill(found, sources, build, test, root, budget, timeout, runs, jobs, static, lease, as_json) -> int:
    import os

    from hazards.engine.campaign import LeasedCampaign
    from hazards.engine.store import Store
    from hazards.mutate.kill import UNJUDGED, Fate, KillConfig, check_config, kill_loop, score

    check_seconds(timeout, "--timeout")
    cfg = KillConfig(root=(root or sources[0].parent).resolve(), test=test, build=build,
                     budget_s=parse_duration(budget), timeout_s=timeout, max_runs=runs,
                     jobs=jobs or (os.cpu_count() or 1), static=static)
    check_config(cfg, sources)
    if not found:
        raise UserError("no mutant: no synchronization site in the sources (with these operators and lines)")
    say = (lambda s: None) if as_json else (lambda s: print(f"mutate: {s}", file=sys.stderr))
    with Store(lease.store_path) as store, LeasedCampaign.acquire(store, "hazards mutate", max_gpus=1,
                                                                  lock_dir=lease.lock_dir, wait_s=lease.wait_s,
                                                                  exclusive=lease.exclusive,
                                                                  without_gpu=True) as frame:
        results = kill_loop(frame, cfg, found, say)
    texts = {m.key: text for m, text in found}
    killed, judged = score(results)
    if as_json:
        print(json.dumps({"score": {"killed": killed, "judged": judged, "mutants": len(results)},
                          "mutants": [r.as_json(texts[r.mutant.key]) for r in results]}))
    else:
        _print_results(results, texts, killed, judged)
    unjudged = Counter(r.fate.value for r in results if r.fate in UNJUDGED)
    if unjudged and judged:
        print(f"mutate: {sum(unjudged.values())} of {len(results)} mutants not judged "
              f"({', '.join(f'{n} {fate}' for fate, n in sorted(unjudged.items()))}): the score covers the judged "
              "ones only; give more --budget or fewer mutants (--operators, --lines)", file=sys.stderr)
    if judged == 0:
        return EXIT_NOT_JUDGED
    if any(r.fate is Fate.SURVIVED for r in results):
        return EXIT_HAZARD
    return EXIT_NOT_JUDGED if unjudged else EXIT_OK


def _print_results(results, texts, killed: int, judged: int) -> None:
    from hazards.mutate.kill import Fate

    for r in results:
        print(f"{r.mutant.id:24s} {r.fate.value:16s} {r.evidence or r.bound}")
    from hazards.engine.report import mutation_score_text

    print(f"mutation score: {mutation_score_text({'killed': killed, 'judged': judged, 'mutants': len(results)})}")
    for r in (r for r in results if r.fate is Fate.SURVIVED):
        print(f"\nsurvived: {r.mutant.id}: {r.mutant.description}; {r.bound}")
        print(r.mutant.diff(texts[r.mutant.key]), end="")
