"""`hazards stress FAMILY`: stress a family's variants on the GPU through the engine."""
from __future__ import annotations

import json
import sys
from typing import Annotated, Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from hazards.cli.app import app
from hazards.cli.options import (LeaseFlags, lease_options, ARCH_HELP, JsonOption, ProgressIntervalOption,
                                 launches_option, literal, progress_interval, timeout_option,
                                 variant_option, HangFlags, hang_options)
from hazards.engine.stall import StallPolicy
from hazards.cli.progress import CampaignProgress
from hazards.engine.errors import UserError, check_seconds
from hazards.engine.stats import format_rate
from hazards.engine.store import Store
from hazards.engine.verdict import Verdict, exit_code as verdicts_exit_code
from hazards.engine import toolchain

DEFAULT_REQUESTS = 10
SANITIZER_DEFAULT_LAUNCHES = 4
SANITIZER_DEFAULT_REQUESTS = 2

_HELP = """Stress a family's variants on a leased GPU; store every batch; judge the catalog.

Each request is one batch of `--launches` launches served by the family's warm server
(docs/protocol.md), validated on the device. Canaries (broken variants) must be detected;
every other variant must stay clean; `--variant` picks some (repeat it). With `--sanitizer`
the family runs `--once` under compute-sanitizer (one process per request) and a sanitizer
error makes the run a `fault` (error_kind sanitizer_race / sanitizer_sync /
sanitizer_memcheck).

Verdicts (the same words as `hazards check` and `hazards soak`): detected, went blind (a
canary its oracle never proved failing), clean, failed (a clean variant failed), error.

Exit status: 0 every expectation met; 1 a canary went blind or a clean variant failed;
2 bad input; 3 some variant had only `error` runs, or the family's server could not start
(no usable GPU).

Examples:

    hazards stress pipeline --launches 1000 --requests 10
    hazards stress ordering --variant mp_plain --set shuffle=true --set stress_blocks=256
    hazards stress pipeline --variant broken_war --variant fixed --sanitizer racecheck
"""


def parse_sets(items: list[str], allowed: dict[str, str]) -> dict[str, Any]:
    """`k=v` overrides: v as JSON when it parses (numbers, true/false), else a string."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--set takes NAME=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key not in allowed:
            raise UserError(f"unknown parameter {key!r} (known: {', '.join(allowed)})")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def print_reports(reports: list[Any]) -> None:
    """One table: per variant the launches, failed launches with CI, throughput, verdict."""
    out = Console(width=None if sys.stdout.isatty() else 220)
    table = Table()
    for col in ("variant", "role", "static", "oracle", "runs", "launches", "failed",
                "per-launch rate (95% CI)", "weak/instance", "launches/s", "verdict"):
        table.add_column(col)
    for r in reports:
        t = r.evidence
        failed = min(t.failed_launches, t.launches)
        weak = f"{t.weak:.0f}/{t.instances:.3g}" if t.instances else "-"
        lps = f"{t.launches / r.wall_s:,.0f}" if r.wall_s > 0 and t.launches else "-"
        counts = " ".join(f"{k}:{v}" for k, v in r.summary.counts.items() if v)
        style = "cyan" if r.verdict is Verdict.ERROR else "green" if r.verdict.ok else "bold red"
        table.add_row(literal(r.variant), literal(r.role), "hazard" if r.static_hazardous else "safe",
                      literal(r.oracle), counts,
                      str(t.launches), str(failed), format_rate(failed, t.launches), weak, lps,
                      f"[{style}]{r.verdict}[/]")
    out.print(table)
    for r in reports:
        if not r.verdict.ok:
            out.print(r.judgement.line(f"{r.family}/{r.variant}", r.expected), highlight=False, markup=False)
        if r.oracle == "sanitizer" and r.evidence.sanitizer_errors:
            out.print(f"{r.variant}: {r.evidence.sanitizer_errors} sanitizer error(s) reported", highlight=False,
                      markup=False)


@app.command("stress", help=_HELP)
@lease_options
@hang_options
def stress_command(
    family: str = typer.Argument(..., help="Family name (see `hazards list`)."),
    variant: Annotated[Optional[List[str]], variant_option("all")] = None,
    launches: Annotated[Optional[int], launches_option(
        f"the family's; {SANITIZER_DEFAULT_LAUNCHES} with --sanitizer")] = None,
    requests: Optional[int] = typer.Option(
        None, "--requests", "-r", show_default=f"{DEFAULT_REQUESTS}; {SANITIZER_DEFAULT_REQUESTS} with --sanitizer",
        help="Requests (batches, one run each) per variant."),
    sanitizer: Optional[str] = typer.Option(None, "--sanitizer", show_default="none",
                                            help="Run under compute-sanitizer: racecheck, synccheck, memcheck or initcheck."),
    sets: Optional[List[str]] = typer.Option(None, "--set", show_default="none",
                                             help="Override a run-time parameter: NAME=VALUE (repeatable)."),
    timeout: Annotated[Optional[float], timeout_option("the family's")] = None,
    arch: str = typer.Option(toolchain.SM90A, "--arch", help=ARCH_HELP),
    json_out: JsonOption = False,
    lease: LeaseFlags = LeaseFlags(),  # --store, --lease-dir, --wait, --exclusive
    progress_every: ProgressIntervalOption = "30s",
    hang: HangFlags = HangFlags(),  # --forensics, --hang-budget, --forensics-share, --stall
) -> None:
    from hazards.engine.campaign import LeasedCampaign
    from hazards.families import get_family
    from hazards.engine.targets.sanitizer import TOOLS
    from hazards.stress_family import family_item, stress_variant

    fam = get_family(family)
    if not fam.binary:
        from hazards.families import all_families

        runnable = ", ".join(f.name for f in all_families() if f.binary)
        raise UserError(f"family {fam.name!r} has no runtime binary: use `hazards static --families {fam.name}` "
                        f"(families with one: {runnable})")
    names = list(variant) if variant else [v.name for v in fam.variants]
    for n in names:
        fam.variant(n)  # UserError naming the known ones
    if sanitizer is not None and sanitizer not in TOOLS:
        raise UserError(f"--sanitizer must be one of {', '.join(TOOLS)}, got {sanitizer!r}")
    n_launch = launches if launches is not None else (SANITIZER_DEFAULT_LAUNCHES if sanitizer else fam.default_launches)
    n_req = requests if requests is not None else (SANITIZER_DEFAULT_REQUESTS if sanitizer else DEFAULT_REQUESTS)
    if n_launch < 1 or n_req < 1:
        raise UserError("--launches and --requests must be at least 1")
    check_seconds(timeout, "--timeout")
    overrides = parse_sets(list(sets or []), fam.runtime_params)
    store_path, wait_s = lease.store_path, lease.wait_s
    interval_s = progress_interval(progress_every)
    policy = hang.policy()
    stall_setting = hang.stall_setting

    reports = []
    with Store(store_path) as store, LeasedCampaign.acquire(store, "hazards stress", max_gpus=1, wait_s=wait_s,
                                                            lock_dir=lease.lock_dir, exclusive=lease.exclusive,
                                                            without_gpu=True, forensics=policy) as frame:
        frame.stall = StallPolicy(stall_setting, store)
        # One warm server in the frame for all variants (the point of a server target). A
        # server that cannot start, or a sanitizer that is not installed, is one clear line
        # before any bar, not a column of error runs.
        frame.warm(family_item(fam, sanitizer=sanitizer, build_target=arch))
        with CampaignProgress(interval_s=interval_s) as progress:
            for n in names:
                reports.append(stress_variant(
                    fam, n, frame=frame, launches=n_launch, requests=n_req, timeout=timeout,
                    sanitizer=sanitizer, overrides=overrides, build_target=arch, observer=progress))
    if json_out:
        print(json.dumps({"family": fam.name, "launches_per_request": n_launch, "requests": n_req,
                          "sanitizer": sanitizer, "overrides": overrides,
                          "variants": [r.to_json() for r in reports]}))
    else:
        print_reports(reports)
    code = verdicts_exit_code(r.verdict for r in reports)  # the one rule every check's verdicts follow
    if code:
        raise typer.Exit(code)
