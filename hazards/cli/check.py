"""`hazards check`: the pre-merge hazard check (static checks, then canaries on every GPU)."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from hazards.cli.app import app
from hazards.engine.errors import UserError

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smh]?)")

_HELP = """Pre-merge hazard check: static checks, then a short stress of every family's
canaries (broken variants) and clean variants on each free GPU.

Each variant runs until its SPRT verdict is settled, its cap, or the budget. Exit 0 only
if the static checks pass, every canary was detected and no clean variant failed; a canary
that was not detected "went blind" and fails the check. Without a GPU the static part
runs and the GPU checks are reported as skipped (by name).

Examples:\n
  hazards check --budget 3m --junit hazards-junit.xml\n
  hazards check --static src/kernels/\n
  hazards check --families pipeline,ordering
"""


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """Seconds from '90', '90s', '3m', '1h30m', '1.5h'; UserError for anything else."""
    s = (text or "").strip().lower()
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos or (not m.group(2) and m.end() != len(s)):
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise UserError(f"cannot read duration {text!r} (use e.g. 90s, 3m, 1h30m)")
    if total <= 0 and not allow_zero:
        raise UserError(f"duration must be positive, got {text!r}")
    return total


def split_names(values: Optional[List[str]]) -> list[str]:
    """Family names from repeated and/or comma-separated options."""
    return [n.strip() for v in values or () for n in v.split(",") if n.strip()]


@app.command("check", help=_HELP)
def check_command(
    paths: Optional[List[str]] = typer.Argument(None, help="Sources or listings for the static checks [default: the catalog]."),
    budget: str = typer.Option("3m", "--budget", help="Time budget for the whole check (e.g. 90s, 3m)."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write a JUnit XML report here."),
    static: bool = typer.Option(False, "--static", help="Run only the static checks (no GPU)."),
    families: Optional[List[str]] = typer.Option(None, "--families", help="Only these families (repeat or comma-separate)."),
    store_path: Optional[Path] = typer.Option(None, "--store", help="Results database [default: $HZ_STORE or .hazards/results.db]."),
    lease_dir: Optional[Path] = typer.Option(None, "--lease-dir", help="GPU lease folder [default: $HZ_LEASE_DIR or .hazards/leases]."),
    wait: str = typer.Option("60s", "--wait", help="How long to wait for a GPU leased by someone else."),
    exclusive: bool = typer.Option(False, "--exclusive", help="Refuse GPUs that run compute processes of others (NVML)."),
) -> None:
    from hazards.checkrun import run_check
    from hazards.engine.junit import write_junit
    from hazards.engine.store import Store

    budget_s, wait_s = parse_duration(budget), parse_duration(wait, allow_zero=True)
    store = None if static else Store(store_path)
    try:
        res = run_check(budget_s=budget_s, families=split_names(families), paths=paths or (), static_only=static,
                        store=store, lock_dir=str(lease_dir) if lease_dir else None, wait_s=wait_s,
                        exclusive=exclusive, log=lambda s: typer.echo(s, err=True))
    finally:
        if store is not None:
            store.close()
    for line in res.summary_lines():
        typer.echo(line)
    if res.campaign_id is not None:
        typer.echo(f"campaign {res.campaign_id} (hazards report {res.campaign_id} -o report.html)")
    if junit is not None:
        write_junit(junit, res.junit_suites())
        typer.echo(f"JUnit report: {junit}")
    sys.exit(res.exit_code)  # main() keeps SystemExit codes (a typer.Exit code would be lost)
