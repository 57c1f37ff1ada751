"""`hazards report`: a campaign as an HTML page with figures, a markdown summary, JUnit XML."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import JsonOption, JUnitOption, StoreOption
from hazards.engine.errors import UserError

_HELP = """Report on a campaign: an HTML page with figures, and on request markdown, JSON or JUnit.

The report holds outcome counts and failure rates with 95% intervals per target/variant,
trends over the last N campaigns of the same kind, time-to-failure and kernel-time
distributions, GPU telemetry, failure signatures (new ones marked) and significant rate
changes against the previous campaign.

Examples:

    hazards report -o report.html
    hazards report 12 -o soak-12.html --markdown --junit soak-12.xml
    hazards report --json
"""


@app.command("report", help=_HELP)
def report_command(
    campaign: Optional[int] = typer.Argument(None, show_default="the latest", help="Campaign id."),
    out: Optional[Path] = typer.Option(None, "-o", "--output", show_default=".hazards/reports/campaign-ID.html",
                                       help="HTML file."),
    markdown: bool = typer.Option(False, "--markdown", help="Also print a markdown summary on stdout."),
    junit: JUnitOption = None,
    last: int = typer.Option(10, "--last", help="Campaigns shown in the trends."),
    store_path: StoreOption = None,
    json_out: JsonOption = False,
) -> None:
    from hazards.engine.junit import write_junit
    from hazards.engine.report import junit_suites, render_markdown, report_json, write_report
    from hazards.engine.store import Store
    from hazards.families import launch_server_families

    if last < 1:
        raise UserError("--last must be at least 1")
    if markdown and json_out:
        raise UserError("give --markdown or --json, not both (both print on stdout)")
    with Store(store_path, read_only=True) as store:
        if campaign is None:
            camps = store.campaigns()
            if not camps:
                raise UserError(f"no campaigns in {store.path}")
            campaign = camps[-1].id
        store.campaign(campaign)  # UserError if unknown, before anything is written
        path = out or store.layout.report(campaign)
        try:
            rep = write_report(store, campaign, path, last=last, families=launch_server_families())
        except OSError as e:  # e.g. the default folder beside a store on a read-only mount
            raise UserError(f"cannot write the report to {path}: {e.strerror or e}"
                            + ("" if out else " (pass -o FILE)")) from None
    quiet = markdown or json_out  # stdout carries the summary: the paths go to stderr
    typer.echo(f"report: {path}", err=quiet)
    if markdown:
        typer.echo(render_markdown(rep))
    if json_out:
        typer.echo(json.dumps({**report_json(rep), "report_html": str(path)}, default=str))
    if junit is not None:
        write_junit(junit, junit_suites(rep))
        typer.echo(f"JUnit report: {junit}", err=quiet)
