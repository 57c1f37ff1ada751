"""`hazards check`: the pre-merge hazard check (static checks beside canaries on every GPU)."""
from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import (BudgetOption, DryRunOption, FamiliesOption, JsonOption, JUnitOption, LeaseFlags,
                                 ProgressIntervalOption, SkipOption, lease_options, parse_duration, parse_skip,
                                 print_plan, progress_interval, split_names, HangFlags, hang_options)
from hazards.engine.forensics.policy import CHECK_HANG_BUDGET_S

# The whole command's time by default: a pre-merge check under a minute. The static part runs
# beside the GPU part; on one GPU every canary is judged in the budget's first ~20-30 s, the
# rest tightens the clean bounds (docs/campaigns.md, "hazards check").
DEFAULT_CHECK_BUDGET = "50s"

_HELP = """Pre-merge hazard check: static checks beside a short stress of every canary on each free GPU.

`--budget` is the whole command's time (default 50s: a pre-merge check under a minute). The
static checks run on the catalog's families (and the given paths) on the CPU while the GPU
part spends the budget on each free GPU: every canary (broken variant) first, until it is detected
or its SPRT accepts the blind rate; then every run to the clean variant whose per-launch upper
bound is weakest, so what the check proves is as tight as the budget allows (stated per clean
variant: a bound per run and per launch); then, when the example database beside the store
holds failing points of `hazards explore`, they are replayed and judged by the static model.
A canary that was not detected "went blind" and fails the check. The command ends when the
budget does (or when the static part does, if that takes longer); a longer budget
(`--budget 3m`) buys tighter clean bounds, not more canaries.

A hang is read before it is killed (`--forensics`, on by default), kept cheap for pre-merge: a
canary whose hang is already located in the store (its stuck locations known) gets no
forensics at all; the first hang of a canary, and any hang of a clean variant, gets the full
collection (cuda-gdb, host stacks, GPU state) within `--hang-budget`, all hangs together
within `--forensics-share` of the budget; hang.md lands in the run's artifact folder.

A check that could not look never passes: without a usable GPU, or without clang-19, nvcc or
the disassembler, every check that could not run is named (with how to install what is
missing) and the check exits 3, unless `--skip` names what not to check (`--skip gpu`, same as
`--static`; `--skip static`; `--skip clang`): that is reported as skipped, in JUnit too.

`--dry-run` checks the input and prints the plan: the static and GPU items, how the budget
would be spent, and what would be skipped or not judged (a missing tool, no usable GPU), then
exits 0 (2 for bad input); nothing is built, leased or stored.

Exit status: 0 every check ran and passed (or was skipped with --skip); 1 a hazard: a failing
static finding, a canary that went blind, a clean variant that failed; 2 bad input; 3 something
could not be judged; 4 the results store failed.

Examples:

    hazards check --junit hazards-junit.xml
    hazards check --budget 3m --junit hazards-junit.xml
    hazards check --static src/kernels/
    hazards check --skip clang --junit hazards-junit.xml
    hazards check --families pipeline,ordering --json
    hazards check --dry-run
"""


@app.command("check", help=_HELP)
@lease_options
@hang_options
def check_command(
    paths: Optional[List[str]] = typer.Argument(None, show_default="the catalog only",
                                                help="Sources or listings for the static checks too."),
    budget: BudgetOption = DEFAULT_CHECK_BUDGET,
    junit: JUnitOption = None,
    static: bool = typer.Option(False, "--static", help="Run only the static checks (no GPU); the same as `--skip gpu`."),
    skip: SkipOption = None,
    families: FamiliesOption = None,
    lease: LeaseFlags = LeaseFlags(wait="60s"),  # --store, --lease-dir, --wait, --exclusive
    json_out: JsonOption = False,
    progress_every: ProgressIntervalOption = "30s",
    hang: HangFlags = HangFlags(hang_budget=CHECK_HANG_BUDGET_S),  # --forensics, --hang-budget, --forensics-share, --stall
    dry_run: DryRunOption = False,
) -> None:
    from hazards.checkrun import run_check
    from hazards.cli.progress import CampaignProgress
    from hazards.engine.junit import write_junit
    from hazards.engine.store import Store

    budget_s, wait_s = parse_duration(budget), lease.wait_s
    interval_s = progress_interval(progress_every)
    stall_setting = hang.stall_setting
    parts, tools = parse_skip(skip)
    policy = hang.policy(known_canary="none")
    if static:
        parts.add("gpu")
    if dry_run:
        from hazards.plan import check_plan

        return print_plan(check_plan(budget_s=budget_s, families=split_names(families), paths=paths or (),
                                     parts=parts, skip_tools=tools, store_path=lease.store_path), json_out)
    store = None if "gpu" in parts else Store(lease.store_path)
    try:
        with CampaignProgress(interval_s=interval_s) as progress:
            res = run_check(budget_s=budget_s, families=split_names(families), paths=paths or (), skip=parts,
                            skip_tools=tools, store=store, lock_dir=lease.lock_dir, wait_s=wait_s,
                            exclusive=lease.exclusive, log=lambda s: typer.echo(s, err=True),
                            observer=progress, forensics=policy, stall=stall_setting)
    finally:
        if store is not None:
            store.close()
    if junit is not None:
        write_junit(junit, res.junit_suites())
    if json_out:
        typer.echo(json.dumps({**res.to_json(), "junit": str(junit) if junit else None}))
        sys.exit(res.exit_code)
    for line in res.summary_lines():
        typer.echo(line)
    if res.campaign_id is not None:
        typer.echo(f"campaign {res.campaign_id} (hazards report {res.campaign_id} -o report.html)")
    if junit is not None:
        typer.echo(f"JUnit report: {junit}")
    sys.exit(res.exit_code)  # main() keeps SystemExit codes (a typer.Exit code would be lost)
