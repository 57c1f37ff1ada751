"""`hazards repro`: run until the first failure, keep what reproduces it, say how often it happens.

A hung kernel's breadcrumbs are caught live."""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from hazards.cli.app import app
from hazards.cli.options import (LeaseFlags, lease_options, CommandArgument, CampaignNameOption, DefineOption, FamilyOption,
                                 JsonOption, MaxErrorsInARowOption, ProgressIntervalOption,                                  launches_option, literal, progress_interval, runs_option, timeout_option,
                                 variant_option, HangFlags, hang_options, parse_define_items)
from hazards.engine.errors import UserError, check_seconds
from hazards.engine.forensics import find_forensics_evidence
from hazards.engine.forensics.policy import REPRO_SHARE
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.sources import MAX_ERRORS_IN_A_ROW
from hazards.engine.stall import FAMILY_STALL_S, StallPolicy
from hazards.engine.stats import describe_rate, rate_ci
from hazards.engine.store import Store

KIND = "repro"
DEFAULT_MAX_RUNS = 100
DEFAULT_TIMEOUT_S = 60.0

_HELP = """Run a program (or a family variant) until its first hang, fault or mismatch.

With `--tripwire`, a private file in /dev/shm is named in HZ_TRIPWIRE_PATH; an instrumented
kernel (standalone/include/hz_tripwire.h) writes its breadcrumbs there, and a hang is read
twice, ~1 s apart, before the kill: the diagnosis names the barrier, the epoch and the
stragglers. A fault gets a post-mortem diagnosis from the same file.

Before a hung program is killed, hang forensics (on by default, `--no-forensics`) attach to it
within `--hang-budget` seconds: cuda-gdb names every resident warp's stuck source line (build
with -lineinfo) and the kind of wait, py-spy (the package's forensics extra) or gdb the host
threads' stacks, NVML and dmesg the GPU's state; hang.md in the run's artifacts says it in one
sentence, which is also the run's reason. With --keep-going, a later hang at a location already
seen gets only a py-spy summary; all hangs together take at most `--forensics-share` of the
runs' timeouts (the first full collection excepted).

The program runs on one leased GPU (CUDA_VISIBLE_DEVICES set to it, NVML telemetry and Xid
events of that GPU per run); on a machine with no GPU it runs as it is.

Kept per failing run (every run with `--keep-tripwire`): output logs, hang.md, tripwire
snapshots and diagnosis, Xid lines, evidence.json; per campaign: binary hash, `git describe`,
environment (repro-context.json). The rate so far is printed with its 95% CI.

Exit status: 0 every run clean; 1 a hazard observed; 2 bad input; 3 only errors.

Examples:

    hazards repro --tripwire --timeout 5 -- ./my_megakernel --seq 4096
    hazards repro --family deadlock --variant broken_epoch --timeout 3
    hazards repro --family deadlock --variant broken_epoch --keep-going -n 30
    hazards repro --family megakernel_layers --variant participant_set -D MKL_CAMPAIGN_STEP=12

`-D` (with --family) builds the family's binary with those defines (with --binary: the defines it
was built with), and a hang is explained for that build (a campaign step's own schedule).
"""


def _parse_params(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    def non_finite(name: str) -> None:  # Python's json reads NaN and Infinity; JSON has neither
        raise ValueError(f"{name} is not a finite number")

    try:
        value = json.loads(text, parse_constant=non_finite)
    except ValueError as e:
        raise UserError(f"--params is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise UserError("--params must be a JSON object, e.g. '{\"workers\": 64}'")
    return value


def _defines(items: list[str] | None) -> dict[str, int | str] | None:
    """-D NAME or NAME=VALUE items (comma-separated too) as build defines, integers where they read so;
    None for none (options.parse_define_items: an empty item or NAME= is a one-line error)."""
    raw = parse_define_items(items)
    return {k: int(v) if v.lstrip("-").isdigit() else v for k, v in raw.items()} or None


def _family_spec(family: str, variant: str | None, params: dict[str, Any], launches: int | None,
                 binary: Path | None, defines: dict[str, Any] | None = None
                 ) -> tuple[list[str], dict[str, Any], Path | None, Any]:
    """argv, run params, names file and the Family for a --family target (its binary built with
    `defines`, unless `binary` is given)."""
    from hazards.families import get_family

    from hazards.family import HARNESS_KEYS, BadPoint

    fam = get_family(family)
    v = fam.variant(variant or fam.variants[0].name)
    point = {k: val for k, val in params.items() if k != "launches"}
    unknown = sorted(set(point) - {p.name for p in fam.params} - set(HARNESS_KEYS))
    if unknown:
        known = ", ".join(p.name for p in fam.params)
        raise UserError(f"--params: family {fam.name!r} has no parameter {unknown[0]!r} (known: {known})")
    try:
        fam.resolve({**point, "variant": v.name})
    except BadPoint as e:  # a value of the wrong type or out of range: refused before any build
        raise UserError(f"--params: {e}") from None
    if binary is not None:
        if not binary.is_file():
            raise UserError(f"--binary {binary} is not a file")
        exe = binary
    elif fam.binary is None:
        raise UserError(f"family {fam.name!r} has no binary (static checks only)")
    else:
        from hazards.stress_family import family_binary

        exe = family_binary(fam, defines=defines)
    run_params = {"variant": v.name, **params}
    if launches is not None:
        run_params["launches"] = launches
    names = fam.source_path / f"{fam.name}_names.h"
    return [str(exe), "--once"], run_params, names if names.exists() else None, fam


def _family_explainer(family: str | None, defines: dict[str, Any] | None = None) -> Any:
    """The family's `explain_hang(snapshot, params)`, if it has one, reading the build of these -D
    `defines` (None: the default build): a campaign build's hang is explained with its own schedule."""
    if not family:
        return None
    from hazards.families import get_family

    import inspect

    explain = get_family(family).explain_hang
    # an explainer without a `defines` argument reads no build-specific schedule: nothing to pass it
    if explain is None or not defines or "defines" not in inspect.signature(explain).parameters:
        return explain
    return lambda snapshot, params: explain(snapshot, params, defines=defines)


def _print_failure(out: Console, seq: int, r: RunResult) -> None:
    out.print(f"[bold]run {seq}: {r.outcome}[/] — {literal(r.reason)}", highlight=False)
    tw = r.evidence.get("tripwire") or {}
    if tw.get("sentence"):
        out.print(f"  tripwire ({tw.get('when', '?')}): {tw['sentence']}", highlight=False, markup=False)
        for note in tw.get("notes", [])[:4]:
            out.print(f"    note: {note}", highlight=False, markup=False)
    xid = _xid(r)
    lines = xid.get("kernel_log")
    if isinstance(lines, list) and lines:
        out.print(f"  kernel log: {lines[-1]}", highlight=False, markup=False)
    if isinstance(xid.get("nvml"), list) and xid["nvml"]:
        out.print(f"  NVML Xid: {xid['nvml']}", highlight=False, markup=False)
    found = find_forensics_evidence(r.evidence)
    if found:
        if (found.get("tripwire") or {}).get("agreement"):
            out.print(f"  tripwire vs debugger: {found['tripwire']['agreement']}", highlight=False, markup=False)
        for why in list((found.get("skipped") or {}).values())[:3]:
            out.print(f"  forensics skipped: {why}", highlight=False, markup=False)
        md = [a for a in found.get("artifacts", []) if a.endswith("hang.md")]
        if md:
            out.print(f"  hang report: {md[0]}", highlight=False, markup=False)
    if r.artifact_dir:
        out.print(f"  artifacts: {r.artifact_dir}", highlight=False, markup=False)


@app.command("repro", help=_HELP, context_settings={"allow_interspersed_args": False})
@lease_options
@hang_options
def repro_command(
    command: CommandArgument = None,
    family: FamilyOption = None,
    variant: Annotated[Optional[str], variant_option("the family's first")] = None,
    params: Optional[str] = typer.Option(None, "--params", show_default="none",
                                         help="JSON object of run parameters (family)."),
    launches: Annotated[Optional[int], launches_option("the family's")] = None,
    binary: Optional[Path] = typer.Option(None, "--binary", show_default="built from the catalog",
                                          help="Prebuilt family binary (skips the build)."),
    defines: DefineOption = None,
    timeout: Annotated[Optional[float], timeout_option(f"the family's, else {DEFAULT_TIMEOUT_S:g}")] = None,
    max_runs: Annotated[int, runs_option(str(DEFAULT_MAX_RUNS))] = DEFAULT_MAX_RUNS,
    old_max_runs: Optional[int] = typer.Option(None, "--max-runs", hidden=True, help="Old spelling of -n/--runs."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Do not stop at the first failure (measure a rate)."),
    tripwire: Optional[bool] = typer.Option(None, "--tripwire/--no-tripwire", show_default="on for --family",
                                            help="Give the program a tripwire file."),
    names: Optional[Path] = typer.Option(None, "--names", show_default="the family's, else none",
                                         help="Phase/barrier names: JSON or a C header."),
    keep_tripwire: bool = typer.Option(False, "--keep-tripwire", help="Keep the raw tripwire file of clean runs too."),
    hang: HangFlags = HangFlags(forensics_share=REPRO_SHARE),  # --forensics, --hang-budget, --forensics-share, --stall
    lease: LeaseFlags = LeaseFlags(),  # --store, --lease-dir, --wait, --exclusive
    name: CampaignNameOption = None,
    json_out: JsonOption = False,
    max_errors_in_a_row: MaxErrorsInARowOption = MAX_ERRORS_IN_A_ROW,
    progress_every: ProgressIntervalOption = "30s",
) -> None:
    from hazards.engine.targets.base import check_argv
    from hazards.engine.tripwire import load_names

    max_runs = old_max_runs if old_max_runs is not None else max_runs
    if max_runs < 1:
        raise UserError(f"-n/--runs must be at least 1, got {max_runs}")
    check_seconds(timeout, "--timeout")
    policy = hang.policy()
    stall_setting = hang.stall_setting
    if launches is not None and launches < 1:
        raise UserError(f"--launches must be at least 1, got {launches}")
    if max_errors_in_a_row < 0:
        raise UserError(f"--max-errors-in-a-row must be 0 (never stop) or more, got {max_errors_in_a_row}")
    store_path = lease.store_path
    interval_s = progress_interval(progress_every)
    run_params = _parse_params(params)
    build_defines = _defines(defines)
    if family is not None:
        if command:
            raise UserError("give either --family or a command after --, not both")
        argv, run_params, default_names, fam = _family_spec(family, variant, run_params, launches, binary,
                                                            build_defines)
        timeout = timeout if timeout is not None else fam.timeout_s
        names = names if names is not None else default_names
        tripwire = True if tripwire is None else tripwire
    else:
        if variant or launches or binary or build_defines:
            raise UserError("--variant/--launches/--binary/-D go with --family")
        argv = check_argv(list(command or []), None, dict(os.environ))
        timeout = timeout if timeout is not None else DEFAULT_TIMEOUT_S
        tripwire = bool(tripwire)
    name_table = load_names(names) if names is not None else None

    spec = {"argv": argv, "cwd": os.getcwd(), "family": family, "defines": build_defines, "params": run_params,
            "timeout": timeout,
            "max_runs": max_runs, "until_fail": not keep_going, "tripwire": tripwire,
            "forensics": hang.forensics, "hang_budget": hang.hang_budget, "forensics_share": hang.forensics_share,
            "names": str(names) if names else None, "max_errors_in_a_row": max_errors_in_a_row}
    store = Store(store_path)
    with store:
        summary, failures = _run(store, spec, argv, run_params, tripwire, name_table, keep_tripwire, name, lease,
                                 interval_s, policy, stall_setting, FAMILY_STALL_S if family is not None else None)
    _report(summary, failures, spec, store, json_out)
    sys.exit(1 if summary.failures else (3 if summary.errors else 0))


def _run(store: Store, spec: dict[str, Any], argv: list[str], run_params: dict[str, Any], tripwire: bool,
         name_table: Any, keep_tripwire: bool, name: str | None,
         lease: LeaseFlags, interval_s: float, policy: Any, stall_setting: str | float,
         item_stall_s: float | None) -> tuple[Any, list[tuple[int, RunResult]]]:
    from contextlib import nullcontext

    from hazards.cli.progress import CampaignProgress
    from hazards.engine.campaign import LeasedCampaign
    from hazards.engine.loop import WorkItem
    from hazards.engine.targets import CommandTarget
    from hazards.engine.targets.base import default_name
    from hazards.engine.targets.repro import KernelLog, ReproTarget, run_context
    from hazards.engine.targets.tripwire import TripwireTarget
    from hazards.engine.tripwire import TripwireFile

    failures: list[tuple[int, RunResult]] = []
    item = WorkItem(target=name or default_name(argv), variant=str(run_params.get("variant", "")), kind="command",
                    argv=tuple(argv), params=run_params, timeout_s=spec["timeout"],
                    stall_s=item_stall_s)  # a family binary beats (HZ_PROGRESS) while its GPU work completes
    with (TripwireFile() if tripwire else nullcontext()) as tw, \
            LeasedCampaign.acquire(store, "hazards repro", max_gpus=1, wait_s=lease.wait_s, without_gpu=True,
                                   lock_dir=lease.lock_dir, exclusive=lease.exclusive, forensics=policy) as frame:
        frame.stall = StallPolicy(stall_setting, store)
        kernel_log = KernelLog()  # what the log held before the first run

        def make_target(item: WorkItem, env: dict[str, str]) -> Any:
            # CommandTarget -> TripwireTarget -> ReproTarget, on the leased GPU
            target: Any = CommandTarget(argv, env={**(tw.env() if tw else {}), **env}, name=item.target)
            if tw is not None:
                target = TripwireTarget(target, tw, names=name_table,
                                        keep="always" if keep_tripwire else "failures",
                                        explain=_family_explainer(spec.get("family"), spec.get("defines")))
            return ReproTarget(target, kernel_log)

        cid = frame.create(KIND, spec, name=name)
        ctx_dir = store.layout.artifacts(cid)
        ctx_dir.mkdir(parents=True, exist_ok=True)
        (ctx_dir / "repro-context.json").write_text(json.dumps(run_context(argv, spec["cwd"]), indent=1))

        def on_result(seq: int, r: RunResult, counts: dict[str, int]) -> None:
            if Outcome(r.outcome).is_failure or r.outcome is Outcome.ERROR:
                failures.append((seq, r))

        with CampaignProgress(interval_s=interval_s) as progress:
            summary = frame.repeat(item=item, n=spec["max_runs"], timeout=spec["timeout"],
                                   until_fail=spec["until_fail"], campaign_id=cid, on_result=on_result,
                                   target_factory=make_target, evidence_json=True, observer=progress,
                                   artifacts="all" if keep_tripwire else "failures",
                                   max_errors_in_a_row=spec["max_errors_in_a_row"])
    return summary, failures


def _xid(r: RunResult) -> dict[str, Any]:
    """The run's Xid evidence: kernel-log lines (ReproTarget) and NVML's events on the
    leased GPU (the loop's telemetry window; absent without NVML)."""
    xid = dict(r.evidence.get("xid") or {})
    tel = r.evidence.get("telemetry")
    if isinstance(tel, dict) and "xids" in tel:
        xid["nvml"] = tel["xids"]
    return xid


def _report(summary: Any, failures: list[tuple[int, RunResult]], spec: dict[str, Any], store: Store,
            json_out: bool) -> None:
    k, n = summary.failures, summary.judged
    lo, hi = rate_ci(k, n) if n else (0.0, 1.0)
    if json_out:
        d = summary.to_json()
        d.update({"store": str(store.path), "argv": spec["argv"], "rate_in_words": describe_rate(k, n),
                  "failures": [{"seq": s, "outcome": str(r.outcome), "reason": r.reason,
                                "tripwire": r.evidence.get("tripwire"), "xid": _xid(r),
                                "forensics": find_forensics_evidence(r.evidence),
                                "artifact_dir": r.artifact_dir} for s, r in failures[:50]],
                  "ci_95": [lo, hi]})
        print(json.dumps(d, default=str))
        return
    out = Console(width=None if sys.stdout.isatty() else 200)
    out.print(f"[bold]repro campaign {summary.campaign_id}[/]: {literal(shlex.join(spec['argv']))}", highlight=False)
    for seq, r in failures[:3]:
        _print_failure(out, seq, r)
    if len(failures) > 3:
        out.print(f"  … {len(failures) - 3} more failing runs (see `hazards stats`)", highlight=False)
    out.print("counts: " + ", ".join(f"{o} {c}" for o, c in summary.counts.items() if c), highlight=False)
    out.print(describe_rate(k, n), highlight=False)
    if summary.stop_reason:
        out.print(f"stopped: {summary.stop_reason}", highlight=False, markup=False)
    out.print(f"artifacts: {store.layout.artifacts(summary.campaign_id)}", highlight=False, markup=False)
