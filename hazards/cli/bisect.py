"""`hazards bisect`: the first commit where a flaky failure began, judged on rates."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import (BuildOption, interrupt_exit_code, say_interrupted, CommandArgument, FamilyOption, JsonOption, LeaseFlags, ResumeOption,
                                 lease_options, parse_duration, timeout_option, variant_option)
from hazards.engine.errors import EXIT_NOT_JUDGED, EXIT_OK, UserError, check_seconds
from hazards.engine.stats import percent

DEFAULT_BUDGET = 3000
DEFAULT_TIMEOUT_S = 60.0

_HELP = """Find the first commit where a flaky failure began: bisect on failure rates, not single runs.

`git bisect run` on a 5% hang gives wrong answers (a good-looking commit was a lucky one).
This measures the bad end first (until 8 failures, then 16 and 32 if needed) and refuses, in
one line, when its failure rate is not clearly above the good end's over as many runs
(one-sided Fisher p < 0.05 in all). Then it
bisects the first-parent history: each commit runs until a sequential test (Wald's SPRT,
error rates `--alpha` and `--beta`) decides "like good" or "like bad", so a 0% -> 100% change
costs a few runs per commit and a 0% -> 5% change about a hundred. A commit that does not
build, or whose test cannot run, is skipped like `git bisect skip`. A commit still undecided
when `--run-budget` runs are spent ends the bisection as undecided (exit 3) with the range left.

Each commit is checked out with `git worktree` in a scratch folder (never your checkout, which
is not touched, Ctrl-C included) and built there with `--build` (cached per commit and build
command); the test runs in that folder. Every run is stored, one campaign per commit;
`--resume ID` continues an interrupted bisection without re-running or rebuilding anything.

`--family F --variant V` runs a catalog family's variant instead of a command, its kernel
built from each commit's `standalone/` folder.

Exit status: 0 culprit found; 2 bad input or a refusal (the ends do not differ); 3 undecided
or ambiguous (skipped commits hide the culprit); 128 + N stopped by signal N. docs/bisect.md
says how it decides, its error rates and how many runs to expect.

Examples:

    hazards bisect --good v1.2 --bad HEAD --build 'make -j8' -- ./build/test_attention --iters 10
    hazards bisect --good abc123 --bad main --family pipeline --variant fixed --build ''
    hazards bisect --resume 7 --json
"""


def parse_threshold(text: str) -> float | None:
    """--rate-threshold: 'auto' (None), or a rate as 0.05 or 5%."""
    t = text.strip().lower()
    if t == "auto":
        return None
    try:
        value = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise UserError(f"--rate-threshold {text!r} is neither 'auto' nor a rate (0.05 or 5%)") from None
    if not 0.0 < value < 0.5:
        raise UserError(f"--rate-threshold must be above 0 and below 50%, got {text}")
    return value


def _check_error_rate(value: float, flag: str) -> float:
    if not 0.0 < value < 0.5:
        raise UserError(f"{flag} must be above 0 and below 0.5, got {value:g}")
    return value


def _plan(repo: Path, good: Optional[str], bad: Optional[str], command: list[str], family: Optional[str],
          variant: Optional[str], build: Optional[str], timeout: Optional[float], budget: int, alpha: float,
          beta: float, threshold: Optional[float], scratch: Optional[Path]):
    from hazards.bisect.history import first_parent_range, repo_root
    from hazards.bisect.session import Plan
    from hazards.engine.toolchain import cache_dir

    if not good or not bad:
        raise UserError("give --good REF and --bad REF (or --resume ID)")
    if family is None and not command:
        raise UserError("give the test command after -- (or --family F --variant V)")
    if family is not None and command:
        raise UserError("give either --family or a command after --, not both")
    if family is None and variant:
        raise UserError("--variant goes with --family")
    if family is not None:
        from hazards.families import get_family

        fam = get_family(family)  # UserError for an unknown family
        if fam.binary is None:
            raise UserError(f"family {fam.name!r} has no binary (static checks only)")
        variant = fam.variant(variant or fam.variants[0].name).name
        timeout = timeout if timeout is not None else fam.timeout_s
        family = fam.name
    root = repo_root(repo.resolve())
    commits = first_parent_range(root, good, bad)
    # One scratch folder per repository (its path's hash): two checkouts never share builds.
    folder = scratch.resolve() if scratch else \
        cache_dir("bisect") / f"{root.name}-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}"
    return Plan(repo=str(root), good=good, bad=bad, commits=commits, argv=list(command) or None, family=family,
                variant=variant, build=build or None, timeout_s=timeout if timeout is not None else DEFAULT_TIMEOUT_S,
                budget=budget, alpha=alpha, beta=beta, threshold=threshold, scratch=str(folder))


def _say(line: str) -> None:
    try:
        print(f"hazards bisect: {line}", file=sys.stderr, flush=True)
    except OSError:
        pass


def _print_text(doc: dict) -> None:
    def rate(r: dict | None) -> str:
        return r["in_words"] + f" ({r['failures']}/{r['runs']})" if r else "n/a"

    if doc["status"] == "found":
        print(f"first bad commit: {doc['culprit']} {doc['subject']}")
        print(f"  rate before: {rate(doc['rate_before'])}; after: {rate(doc['rate_after'])}")
        print(f"  confidence: {percent(doc['confidence'])} (every decision right; SPRT alpha "
              f"{doc['design']['alpha']:g}, beta {doc['design']['beta']:g}, p0 {percent(doc['design']['p0'])}, "
              f"p1 {percent(doc['design']['p1'])})")
    else:
        print(f"{doc['status']}: {doc['reason']}")
        if doc["candidates"]:
            print(f"  the first bad commit is one of {len(doc['candidates'])}: "
                  + ", ".join(c[:12] for c in doc["candidates"][:10]) + (" ..." if len(doc["candidates"]) > 10 else ""))
    print(f"runs: {doc['runs']} (bisection {doc['bisect']} in {doc['store']})")
    for c in doc["commits"]:
        what = c["why"] if c["verdict"] == "skipped" else f"{c['runs']} runs, {rate(c['rate'])}"
        print(f"  {c['commit'][:12]} {c['verdict']:<10} {c['role']:<8} {what}  {c['subject'][:60]}")


@app.command("bisect", help=_HELP, context_settings={"allow_interspersed_args": False})
@lease_options
def bisect_command(
    command: CommandArgument = None,
    good: Optional[str] = typer.Option(None, "--good", show_default="none", help="A commit without the failure."),
    bad: Optional[str] = typer.Option(None, "--bad", show_default="none", help="A commit with it."),
    build: BuildOption = None,
    build_timeout: str = typer.Option("1h", "--build-timeout", help="Longest a build may take."),
    family: FamilyOption = None,
    variant: Annotated[Optional[str], variant_option("the family's first")] = None,
    rate_threshold: str = typer.Option("auto", "--rate-threshold",
                                       help="'auto' (from the ends) or the rate between good and bad (e.g. 5%)."),
    budget: int = typer.Option(DEFAULT_BUDGET, "--run-budget", help="Runs to spend at most, the ends included."),
    alpha: float = typer.Option(0.01, "--alpha", help="Per commit: chance of calling a good commit bad."),
    beta: float = typer.Option(0.01, "--beta", help="Per commit: chance of calling a bad commit good."),
    timeout: Annotated[Optional[float], timeout_option(f"the family's, else {DEFAULT_TIMEOUT_S:g}")] = None,
    repo: Path = typer.Option(Path("."), "--repo", help="The git checkout whose history is bisected."),
    scratch: Optional[Path] = typer.Option(None, "--scratch", show_default="the build cache's bisect/ folder",
                                           help="Where commits are checked out and built."),
    resume: ResumeOption = None,
    json_out: JsonOption = False,
    lease: LeaseFlags = LeaseFlags(),
) -> None:
    from hazards.bisect.session import KIND, Plan, result_json, run_bisection
    from hazards.engine.store import Store

    check_seconds(timeout, "--timeout")
    build_timeout_s = parse_duration(build_timeout)
    if budget < 2:
        raise UserError(f"--run-budget must be at least 2 runs, got {budget}")
    _check_error_rate(alpha, "--alpha")
    _check_error_rate(beta, "--beta")
    threshold = parse_threshold(rate_threshold)
    store = Store(lease.store_path)
    with store:
        if resume is not None:
            if good or bad or command or family:
                raise UserError("--resume continues a stored bisection: give no --good, --bad, --family or command")
            camp = store.campaign(resume)
            if camp.kind != KIND:
                raise UserError(f"campaign {resume} is a {camp.kind!r} campaign, not a bisection")
            plan = Plan.from_spec(camp.spec)
        else:
            plan = _plan(repo, good, bad, list(command or []), family, variant, build, timeout, budget, alpha, beta,
                         threshold, scratch)
        started: list[int] = []
        try:
            outcome, bisect_id = run_bisection(store, plan, resume=resume, lease=lease, say=_say,
                                               build_timeout_s=build_timeout_s, on_campaign=started.append)
        except KeyboardInterrupt as e:  # Ctrl-C or a stop signal: say how to continue, then exit 128+N
            say_interrupted("bisect", started[0] if started else None, lease.store_path)
            sys.exit(interrupt_exit_code(e))
        if outcome.status == "refused":
            raise UserError(f"cannot bisect: {outcome.reason}")
        doc = result_json(outcome, plan, bisect_id, store)
    if json_out:
        print(json.dumps(doc))
    else:
        _print_text(doc)
    sys.exit(EXIT_OK if outcome.status == "found" else EXIT_NOT_JUDGED)
