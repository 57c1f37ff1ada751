"""`hazards run`: run any program N times, judge every run, store it, report the rate."""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from hazards.cli.app import app
from hazards.cli.options import (LeaseFlags, lease_options, CommandArgument, CampaignNameOption, JsonOption,
                                 MaxErrorsInARowOption, ProgressIntervalOption, ResumeOption,                                  interrupt_exit_code, literal, say_interrupted, progress_interval, runs_option,
                                 timeout_option, HangFlags, hang_options)
from hazards.cli.progress import OUTCOME_STYLE, CampaignProgress
from hazards.engine.campaign import CampaignSummary, LeasedCampaign, check_resumable
from hazards.engine.errors import EXIT_HAZARD, EXIT_NOT_JUDGED, EXIT_OK, UserError, check_seconds
from hazards.engine.loop import ARTIFACT_POLICIES, WorkItem
from hazards.engine.outcome import OUTCOMES
from hazards.engine.sources import MAX_ERRORS_IN_A_ROW
from hazards.engine.stall import StallPolicy
from hazards.engine.stats import describe_rate
from hazards.engine.store import Store
from hazards.engine.targets.base import check_argv, check_cwd, check_env, default_name

DEFAULT_N = 20
DEFAULT_N_UNTIL_FAIL = 1000
DEFAULT_TIMEOUT_S = 60.0
KIND = "run"

_HELP = """Run a program N times; judge, store and count every run.

Each run is exactly one of clean, hang, fault, mismatch, error (docs/protocol.md says how exit
codes, signals, fault messages and HZ_RESULT lines are judged). Every run is committed to the
results store the moment it ends, so a killed campaign can be continued with `--resume ID`
(its stored command; `-n` raises its total).

The program runs on one leased GPU (CUDA_VISIBLE_DEVICES set to it, NVML telemetry per run);
on a machine with no GPU it runs as it is, with its environment untouched.

A hung run is read before it is killed (`--forensics`, on by default): host stacks (py-spy,
gdb), device warps (cuda-gdb) and GPU state, within `--hang-budget` per hang; a full collection
for the first hang of a new stuck location, a py-spy summary after, all within
`--forensics-share` of the runs' timeouts. Each hang's hang.md lands in its artifact folder.

Progress goes to stderr: a live display in a terminal, else one status line every
`--progress-interval`. A run of `error` runs (the program cannot even be checked, e.g. an
import error) stops the campaign after `--max-errors-in-a-row` of them, with the reason.

Exit status: 0 every run was clean; 1 a hazard was observed (hang, fault or mismatch); 2 bad
input; 3 no hazard observed but some runs ended in `error` (the check itself failed, so clean
cannot be claimed); 128 + N stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).

Examples:

    hazards run -n 50 --timeout 10 -- python3 demo.py --seq 4096
    hazards run --until-fail -- ./my_kernel_test
    hazards run --resume 3 -n 500
"""


def check_run_options(n: int | None, timeout: float | None, result_regex: str | None,
                      max_errors_in_a_row: int = MAX_ERRORS_IN_A_ROW) -> None:
    """Validate the numeric and regex options before anything is opened or run."""
    if max_errors_in_a_row < 0:
        raise UserError(f"--max-errors-in-a-row must be 0 (never stop) or more, got {max_errors_in_a_row}")
    if n is not None and n < 1:
        raise UserError(f"-n must be at least 1, got {n}")
    check_seconds(timeout, "--timeout")
    if result_regex is not None:
        try:
            re.compile(result_regex)
        except re.error as e:
            raise UserError(f"--result-regex is not a valid regular expression: {e}") from None


def validate_argv(argv: list[str], cwd: str | Path | None = None) -> list[str]:
    """argv if it names a program we can start, else a one-line UserError (nothing runs)."""
    if not argv or not str(argv[0]).strip():
        raise UserError("no command given: put it after `--`, e.g. hazards run -n 10 -- ./my_test")
    return check_argv(list(argv), cwd, check_env(None))


def command_item(spec: dict[str, Any]) -> WorkItem:
    """The work item of a `run` spec (argv, cwd, name, result_regex, timeout).

    Checks the program (exists, executable, on PATH) and the working directory first and
    raises a one-line UserError, so call this before anything is written.
    """
    argv = validate_argv(spec.get("argv") or [], check_cwd(spec.get("cwd")))
    return WorkItem(target=spec.get("name") or default_name(argv), kind="command", argv=tuple(argv),
                    cwd=spec.get("cwd"), result_regex=spec.get("result_regex"),
                    timeout_s=spec.get("timeout") or DEFAULT_TIMEOUT_S)


def summary_json(summary: CampaignSummary, store: Store, spec: dict[str, Any], target_name: str) -> dict[str, Any]:
    """The one JSON object `hazards run --json` prints."""
    d = summary.to_json()
    d.update({"store": str(store.path), "target": target_name, "argv": spec["argv"],
              "rate_in_words": describe_rate(summary.failures, summary.judged)})
    d["signatures"] = [{"outcome": s.outcome, "error_kind": s.error_kind, "message": s.message,
                        "count": s.count} for s in store.signatures(summary.campaign_id)]
    return d


def print_summary(summary: CampaignSummary, store: Store, spec: dict[str, Any]) -> None:
    """Human summary: outcome counts, the rate in words, top failure signatures, resume hint."""
    out = Console(width=None if sys.stdout.isatty() else 200)  # logs: no folding
    out.print(f"[bold]campaign {summary.campaign_id}[/]: {literal(shlex.join(spec['argv']))}", highlight=False)
    table = Table()
    for o in OUTCOMES:
        table.add_column(f"[{OUTCOME_STYLE[o.value]}]{o.value}[/]", justify="right")
    table.add_column("total", justify="right")
    table.add_row(*[str(summary.counts[o.value]) for o in OUTCOMES], str(summary.n))
    out.print(table)
    out.print(describe_rate(summary.failures, summary.judged), highlight=False)
    if summary.errors:
        out.print(f"{summary.errors} run(s) ended in `error` (the check itself failed); "
                  "they are not counted in the rate", highlight=False)
    for s in store.signatures(summary.campaign_id)[:5]:
        kind = f" ({s.error_kind})" if s.error_kind and s.error_kind != s.outcome else ""
        out.print(f"  {s.count:>5} x {s.outcome}{kind}: {s.message}", highlight=False, markup=False)
    if summary.stop_reason:
        out.print(f"stopped early: {literal(summary.stop_reason)}", highlight=False)
    if summary.n < summary.requested and summary.stop_reason is None:
        out.print(f"incomplete: continue with `hazards run --resume {summary.campaign_id}`", highlight=False)
    out.print(f"store: {literal(store.path)}", highlight=False)


def exit_code(summary: CampaignSummary) -> int:
    """0 all clean, 1 a hazard observed, 3 only infrastructure errors besides clean runs."""
    if summary.failures:
        return EXIT_HAZARD
    if summary.errors:
        return EXIT_NOT_JUDGED
    return EXIT_OK


def _open_resumed(store_path: Path | None, campaign_id: int, n: int | None, timeout: float | None,
                  until_fail: bool) -> tuple[Store, dict[str, Any]]:
    """Store and spec of a campaign to resume (its program checked); -n/--timeout/--until-fail
    update it."""
    store = Store(store_path, create=False)
    try:
        camp = store.campaign(campaign_id)
        if camp.kind != KIND:
            raise UserError(f"campaign {campaign_id} is a '{camp.kind}' campaign, not a `hazards run` one")
        check_resumable(store, campaign_id)  # before the spec is updated or anything run
        spec = dict(camp.spec)
        command_item(spec)
    except BaseException:
        store.close()
        raise
    changed = {"n": n, "timeout": timeout, "until_fail": until_fail or None}
    changed = {k: v for k, v in changed.items() if v is not None and spec.get(k) != v}
    if changed:
        spec.update(changed)
        store.update_campaign_spec(campaign_id, spec)
    return store, spec


@app.command("run", help=_HELP, context_settings={"allow_interspersed_args": False})
@lease_options
@hang_options
def run_command(
    command: CommandArgument = None,
    n: Annotated[Optional[int], runs_option(f"{DEFAULT_N}; {DEFAULT_N_UNTIL_FAIL} with --until-fail")] = None,
    timeout: Annotated[Optional[float], timeout_option(f"{DEFAULT_TIMEOUT_S:g}")] = None,
    until_fail: bool = typer.Option(False, "--until-fail", help="Stop at the first hang, fault or mismatch."),
    json_out: JsonOption = False,
    lease: LeaseFlags = LeaseFlags(),  # --store, --lease-dir, --wait, --exclusive
    name: CampaignNameOption = None,
    result_regex: Optional[str] = typer.Option(None, "--result-regex", show_default="none",
                                               help="A regex on the output that marks a run as a mismatch."),
    resume: ResumeOption = None,
    artifacts: str = typer.Option("failures", "--artifacts",
                                  help="Per-run folders (logs, hang snapshots) under the store's artifacts/: "
                                       "failures (keep them for non-clean runs), all, none."),
    max_errors_in_a_row: MaxErrorsInARowOption = MAX_ERRORS_IN_A_ROW,
    progress_every: ProgressIntervalOption = "30s",
    hang: HangFlags = HangFlags(),  # --forensics, --hang-budget, --forensics-share, --stall
) -> None:
    check_run_options(n, timeout, result_regex, max_errors_in_a_row)
    policy = hang.policy()
    stall_setting = hang.stall_setting
    store_path, wait_s = lease.store_path, lease.wait_s
    interval_s = progress_interval(progress_every)
    if artifacts not in ARTIFACT_POLICIES:
        raise UserError(f"--artifacts must be one of {', '.join(ARTIFACT_POLICIES)}, got {artifacts!r}")
    if resume is not None:
        if command:
            raise UserError("--resume takes the command from the stored campaign; do not give one")
        if name is not None or result_regex is not None:
            raise UserError("--resume keeps the campaign's --name and --result-regex; do not give them")
        store, spec = _open_resumed(store_path, resume, n, timeout, until_fail)
        campaign_id: int | None = resume
    else:
        spec = {"argv": list(command or []), "cwd": os.getcwd(), "name": name,
                "result_regex": result_regex, "until_fail": until_fail,
                "n": n if n is not None else (DEFAULT_N_UNTIL_FAIL if until_fail else DEFAULT_N),
                "timeout": timeout if timeout is not None else DEFAULT_TIMEOUT_S}
        command_item(spec)  # checks the program before the store is touched
        store = Store(store_path)
        campaign_id = None
    item = command_item(spec)
    try:
        with store, LeasedCampaign.acquire(store, "hazards run", max_gpus=1, wait_s=wait_s,
                                           lock_dir=lease.lock_dir, exclusive=lease.exclusive,
                                           without_gpu=True, forensics=policy) as frame:
            frame.stall = StallPolicy(stall_setting, store)
            if campaign_id is None:
                campaign_id = frame.create(KIND, spec, name=name)
            else:
                frame.reopen(campaign_id, KIND)
            with CampaignProgress(interval_s=interval_s) as progress:
                summary = frame.repeat(item=item, n=spec["n"], timeout=spec["timeout"],
                                       until_fail=spec["until_fail"], campaign_id=campaign_id,
                                       observer=progress, artifacts=artifacts,
                                       max_errors_in_a_row=max_errors_in_a_row)
            if json_out:
                print(json.dumps(summary_json(summary, store, spec, item.target)))
            else:
                print_summary(summary, store, spec)
    except KeyboardInterrupt as e:
        # typer turns this into an exit code the entry point would drop: say it and exit here
        say_interrupted("run", campaign_id, store_path)
        sys.exit(interrupt_exit_code(e))
    sys.exit(exit_code(summary))
