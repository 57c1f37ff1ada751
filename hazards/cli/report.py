"""`hazards report`: a campaign as an HTML page with figures, a markdown summary, JUnit XML."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import StoreOption
from hazards.engine.errors import UserError

_HELP = """Report on a campaign (default: the latest): outcome counts and failure rates
with 95% intervals per target/variant, trends over the last N campaigns of the same kind,
time-to-failure and kernel-time distributions, GPU telemetry, failure signatures (new ones
marked) and significant rate changes against the previous campaign.

Examples:\n
  hazards report -o report.html\n
  hazards report 12 -o soak-12.html --markdown --junit soak-12.xml
"""


@app.command("report", help=_HELP)
def report_command(
    campaign: Optional[int] = typer.Argument(None, help="Campaign id [default: the latest]."),
    out: Optional[Path] = typer.Option(None, "-o", "--output", help="HTML file [default: .hazards/reports/campaign-ID.html]."),
    markdown: bool = typer.Option(False, "--markdown", help="Also print a markdown summary on stdout."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Also write the campaign as JUnit XML."),
    last: int = typer.Option(10, "--last", help="Campaigns shown in the trends."),
    store_path: StoreOption = None,
) -> None:
    from hazards.engine.junit import write_junit
    from hazards.engine.report import junit_suites, render_markdown, write_report
    from hazards.engine.store import Store

    if last < 1:
        raise UserError("--last must be at least 1")
    with Store(store_path, create=False) as store:
        if campaign is None:
            camps = store.campaigns()
            if not camps:
                raise UserError(f"no campaigns in {store.path}")
            campaign = camps[-1].id
        store.campaign(campaign)  # UserError if unknown, before anything is written
        path = out or store.path.parent / "reports" / f"campaign-{campaign}.html"
        rep = write_report(store, campaign, path, last=last)
    typer.echo(f"report: {path}", err=markdown)
    if markdown:
        typer.echo(render_markdown(rep))
    if junit is not None:
        write_junit(junit, junit_suites(rep))
        typer.echo(f"JUnit report: {junit}", err=markdown)
