"""`hazards soak`: every family/variant and registered target on every free GPU for a budget."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import (BudgetOption, CampaignNameOption, DryRunOption, FamiliesOption, JsonOption,
                                 JUnitOption, LeaseFlags, ProgressIntervalOption, ResumeOption, interrupt_exit_code,
                                 lease_options, parse_duration, print_plan, progress_interval, say_interrupted,
                                 split_names, HangFlags, hang_options)
from hazards.engine.errors import UserError
from hazards.plan import SoakSelection, resumed_soak, soak_plan

_HELP = """Nightly soak: every family/variant and registered target on every free GPU, for a time budget.

Every family/variant plus the targets of a TOML file run spread over every free GPU (one warm
launch server per family per GPU), as one campaign. Resumable with `--resume ID` (the
remaining budget is recomputed from the stored runs). At the end every item is judged
against the store's history: a clean item that failed with a failure never seen before in
the store, or whose failure rate rose significantly since the previous soak (Holm-corrected
across the items), regressed; one that failed as before is a known hazard (reported, not
flagged); a canary that went blind or whose detection rate dropped fails. An HTML report
(and with `--junit` a JUnit file failing exactly what the exit status counts) is written.

The budget goes where evidence is thin (`--allocation evidence`): a canary runs until it is
seen failing, then one run in 50 re-checks the canaries already seen; every other run goes to
the clean variant or target whose per-launch upper bound is weakest. `--allocation uniform`
gives every item the same GPU time (the former behaviour). Rates are reported per run and per
launch. A share of the budget (`--explore`, 0.2) runs `hazards explore` on every family,
starting with the failing points of the example database beside the store.

A hang is read before it is killed (`--forensics`, on by default): the first hang of each item
(or at a new stuck location) gets the full collection (host stacks, device warps, GPU state)
within `--hang-budget`, later ones a py-spy/tripwire summary, all of them within
`--forensics-share` of the budget; each hang's hang.md is in its run's artifact folder and the
report links each new hang signature to it. (`--executor ray`: the nodes kill hangs without
forensics.)

Progress goes to stderr: a live display in a terminal, else one status line every
`--progress-interval`. `--dry-run` checks everything given (families, the targets file, a
resumed campaign) and prints the items, how the budget would be spent and what would be
skipped, without a GPU, a build or a store write.

Exit status: 0 nothing flagged; 1 a regression, a canary that went blind, or a confirmed
disagreement with a static model (the explore share); 2 bad input (or
no free GPU, or a Ray head that does not answer); 3 an item never judged (only errors,
dropped after repeated errors, not reached in the budget, a server that never completed its
handshake); 4 the results store failed; 5 the infrastructure degraded and nothing else
was flagged (`--executor ray`: a node was lost mid-soak, the others ran the rest of the
budget).

Examples:

    hazards soak --budget 30m --report soak.html
    hazards soak --families pipeline --targets targets.toml
    hazards soak --resume 12 --json
    hazards soak --targets targets.toml --dry-run
"""


def soak_items(selection, observer=None) -> list:
    """Work items for the selected families (all variants; builds or takes each family's
    launch server from the build cache, shown by `observer`) and the targets file."""
    from hazards.checkrun import default_items_for, family_builds

    items = []
    for _, built in family_builds(selection.families, lambda f: list(f.variants), default_items_for, observer):
        if isinstance(built, UserError):
            raise built
        items.extend(built)
    return items + selection.targets


@app.command("soak", help=_HELP)
@lease_options
@hang_options
def soak_command(
    budget: BudgetOption = "30m",
    families: FamiliesOption = None,
    targets: Optional[Path] = typer.Option(None, "--targets", show_default="none",
                                           help="TOML file of registered targets (`[[target]]` tables)."),
    no_families: bool = typer.Option(False, "--no-families", help="Only the --targets, no catalog families."),
    resume: ResumeOption = None,
    executor: str = typer.Option("local", "--executor", help="Where the per-GPU loops run: local, or ray (a Ray cluster)."),
    address: Optional[str] = typer.Option(None, "--address", show_default="a local Ray",
                                          help="An existing Ray cluster's head, HOST:PORT of its GCS (ray://HOST:PORT: Ray Client); "
                                               "checked before anything runs (--executor ray)."),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus", show_default="every free one",
                                           help="Lease at most this many GPUs."),
    report: Optional[Path] = typer.Option(None, "--report", show_default=".hazards/reports/campaign-ID.html",
                                          help="HTML report path."),
    junit: JUnitOption = None,
    lease: LeaseFlags = LeaseFlags(),  # --store, --lease-dir, --wait, --exclusive
    name: CampaignNameOption = None,
    allocation: str = typer.Option("evidence", "--allocation",
                                   help="How runs are spent: evidence (canaries until seen, then 1 run in 50; the "
                                        "rest to the weakest per-launch bound) or uniform (equal GPU time)."),
    explore: float = typer.Option(0.2, "--explore",
                                  help="Share of the budget that runs `hazards explore` on every family (0: none)."),
    json_out: JsonOption = False,
    progress_every: ProgressIntervalOption = "30s",
    hang: HangFlags = HangFlags(),  # --forensics, --hang-budget, --forensics-share, --stall
    dry_run: DryRunOption = False,
) -> None:
    from hazards.cli.progress import CampaignProgress
    from hazards.engine.campaign import NO_GPU_VISIBLE, LeasedCampaign, NoGpuVisible, check_resumable
    from hazards.engine.stall import StallPolicy
    from hazards.engine.leases import lease_candidates
    from hazards.engine.soak import ALLOCATIONS, run_soak
    from hazards.engine.store import Store

    if executor != "local":
        if executor == "ray" and address is not None:  # its form now: a plan must refuse what the soak would
            from hazards.engine.executors.ray_executor import split_address

            split_address(address)
        _check_executor(executor)
    elif address is not None:
        raise UserError("--address names a Ray cluster: it needs --executor ray")
    if max_gpus is not None and max_gpus < 1:
        raise UserError("--max-gpus must be at least 1")
    budget_s, wait_s = parse_duration(budget), lease.wait_s
    stall_setting = hang.stall_setting
    interval_s = progress_interval(progress_every)
    policy = hang.policy()
    if allocation not in ALLOCATIONS:
        raise UserError(f"--allocation must be one of {', '.join(ALLOCATIONS)}, got {allocation!r}")
    if not 0.0 <= explore < 1.0:
        raise UserError(f"--explore must be a share of the budget in [0, 1), got {explore:g}")
    # everything the user wrote is checked before a GPU is asked for (nothing built yet)
    selection = None if resume is not None else SoakSelection.of(split_names(families), targets, no_families)
    if selection is not None and not (selection.families or selection.targets):
        from hazards.families import launch_server_families

        runnable = ", ".join(launch_server_families())
        raise UserError(f"nothing to soak: no family with a launch server selected and no --targets "
                        f"(families with a launch server: {runnable})")
    if dry_run:
        plan = soak_plan(selection, budget_s=budget_s, allocation=allocation, explore=explore, executor=executor,
                         resume=resume, store_path=lease.store_path)
        return print_plan(plan, json_out)
    if resume is not None:  # a campaign whose supervisor still runs: refused before the GPU is asked for
        with Store(lease.store_path, create=False, read_only=True) as store:
            check_resumable(store, resume)
            resumed_soak(store, resume)  # a soak with work items, or one line now
    if executor == "local" and not lease_candidates():  # say so before compiling any family
        raise NoGpuVisible(f"hazards soak needs a free GPU: {NO_GPU_VISIBLE}")
    if selection is None:
        items = None
    else:
        with CampaignProgress(interval_s=interval_s) as progress:
            items = soak_items(selection, progress)
    store = Store(lease.store_path)
    if executor != "local":
        if explore > 0 and not no_families and resume is None:
            typer.echo(f"hazards soak: --explore is not run with --executor {executor} (it explores on this "
                       "host's GPUs); the whole budget goes to the items", err=True)
        with CampaignProgress(interval_s=interval_s) as progress:
            res = _remote_soak(executor, store, items, budget_s=budget_s, resume=resume, name=name,
                               address=address, max_gpus=max_gpus, allocation=allocation, observer=progress,
                               lock_dir=lease.lock_dir, exclusive=lease.exclusive)
        return _finish(store, res, report, json_out, junit)
    try:
        frame = LeasedCampaign.acquire(store, "hazards soak", lock_dir=lease.lock_dir,
                                       max_gpus=max_gpus, wait_s=wait_s, exclusive=lease.exclusive,
                                       forensics=policy)
    except UserError as e:  # the same class (no GPU: exit 3), the command named
        store.close()
        raise type(e)(f"hazards soak needs a free GPU: {e}") from None
    frame.stall = StallPolicy(stall_setting, store)
    explorer = None
    if explore > 0 and not no_families:
        from hazards.checkrun import select_families
        from hazards.explore import explore_share

        explorer = explore_share(select_families(split_names(families)), store.layout.examples,
                                 log=lambda s: typer.echo(s, err=True))
    try:
        with frame, CampaignProgress(interval_s=interval_s) as progress:
            typer.echo(f"soak on {frame.describe()}", err=True)
            res = run_soak(frame, items, budget_s=budget_s, resume=resume, name=name, observer=progress,
                           allocation=allocation, explore_share=explore if explorer else 0.0, explorer=explorer)
    except KeyboardInterrupt as e:  # say how to continue, then exit here (typer would drop the code)
        say_interrupted("soak", frame.campaign_id, lease.store_path)
        sys.exit(interrupt_exit_code(e))
    _finish(store, res, report, json_out, junit)


def _check_executor(executor: str) -> None:
    """UserError unless `executor` is known and its dependencies are installed."""
    try:
        from hazards.engine.executors import check_executor
    except ImportError:
        raise UserError(f"unknown executor {executor!r}: only 'local' is available in this build") from None
    check_executor(executor)


def _remote_soak(executor: str, store, items, **kw):
    """A soak on another executor's per-GPU loops (hazards.engine.executors, e.g. Ray)."""
    from hazards.engine.executors import run_soak_with

    return run_soak_with(executor, store, items, **kw)


def _finish(store, res, report: Path | None, json_out: bool, junit: Path | None = None) -> None:
    """Write the report (and the JUnit file), print the summary (or one JSON object), and
    exit with the soak's code: the same verdicts decide both (`soak_judgements`)."""
    from hazards.engine.junit import write_junit
    from hazards.engine.report import (ReportExtraMissing, build_report, junit_suites, render_markdown, report_json,
                                       write_report)

    from hazards.families import launch_server_families

    out = report or store.layout.report(res.campaign_id)
    families = launch_server_families()
    try:
        rep = write_report(store, res.campaign_id, out, families=families)
    except ReportExtraMissing as e:  # the soak's verdict does not depend on the page
        typer.echo(f"hazards: no HTML report: {e}", err=True)
        rep, out = build_report(store, res.campaign_id, figures=False, families=families), None
    store.close()
    if junit is not None:
        write_junit(junit, junit_suites(rep))
    if json_out:
        typer.echo(json.dumps({
            "campaign": res.campaign_id, "exit_code": res.exit_code, "flagged": res.flagged,
            "problems": {k: {"verdict": res.judgements[k].verdict.value, "message": res.judgements[k].message}
                         for k in res.problems},
            "report_html": str(out) if out else None, "junit": str(junit) if junit else None,
            "status": res.status, "spent_s": res.spent_s, "budget_s": res.budget_s,
            "gpus": [{"gpu": g.gpu, "uuid": g.uuid, "runs": g.runs, "launches": g.launches,
                      "launch_rate": g.launch_rate, "elapsed_s": g.elapsed_s} for g in res.gpu_stats],
            "dropped": res.dropped, "blind": res.blind, "lost": res.lost, "evidence": res.evidence_json(),
            "explored": res.explored, "report": report_json(rep)}, default=str))
        sys.exit(res.exit_code)
    typer.echo(render_markdown(rep))
    for g in res.gpu_stats:
        typer.echo(f"GPU {g.uuid or g.gpu}: {g.runs} runs, {g.launches} launches, "
                   f"{g.launch_rate:.0f} launches/s over {g.elapsed_s:.0f} s")
    for line in res.evidence_lines():
        typer.echo(line)
    for x in res.explored:
        typer.echo(f"explore {x['family']}: " + (x["error"] if x.get("error") and "examples" not in x else
                   f"{x.get('examples', 0)} points, exit {x.get('exit_code')}"))
    for line in res.explore_disagreements:
        typer.echo(f"EXPLORE {line}")
    for key, why in res.dropped.items():
        typer.echo(f"DROPPED {key}: {why}")
    for line in res.canary_lines():
        typer.echo(line)
    for node in res.lost:
        typer.echo(f"LOST {node['note']}")
    if junit is not None:
        typer.echo(f"JUnit report: {junit}")
    typer.echo(f"campaign {res.campaign_id}; report: {out or 'not written'}")
    sys.exit(res.exit_code)
