"""`hazards stats`: failure rates with confidence intervals per target and variant."""
from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from hazards.cli.app import app
from hazards.cli.options import ConfOption, JsonOption, StoreOption, literal
from hazards.engine.errors import UserError
from hazards.engine.outcome import OUTCOMES, item_key
from hazards.engine.stats import format_rate
from hazards.engine.store import Store, Tally

TOP_SIGNATURES = 10


def tally_json(t: Tally, conf: float) -> dict[str, Any]:
    """One target/variant row: n, counts, failure rate over judged runs with its CI."""
    return {"target": t.target, "variant": t.variant, "n": t.n, "counts": dict(t.counts),
            "failures": t.failures, "errors": t.errors, "judged": t.judged, "rate": t.rate(),
            "ci": list(t.ci(conf)), "ci_conf": conf, "ci_method": "exact",
            "upper_one_sided": t.upper(conf)}


@app.command("stats")
def stats_command(
    campaign: Optional[int] = typer.Option(None, "--campaign", show_default="every campaign",
                                           help="Only this campaign's runs."),
    json_out: JsonOption = False,
    conf: ConfOption = 0.95,
    store_path: StoreOption = None,
) -> None:
    """Failure rate per target/variant: n, counts per outcome, rate with an exact CI.

    The rate is hazards (hang + fault + mismatch) over judged runs (all but `error`); with no
    failure, the one-sided upper bound is shown instead of an interval. The most frequent
    failure signatures follow the table.
    """
    if not 0 < conf < 1:
        raise UserError(f"--conf must be between 0 and 1, got {conf:g}")
    with Store(store_path, read_only=True) as store:
        if campaign is not None:
            store.campaign(campaign)  # one-line UserError when it does not exist
        tallies = store.tally(campaign)
        sigs = store.signatures(campaign)
        if json_out:
            print(json.dumps({"store": str(store.path), "campaign": campaign,
                              "rows": [tally_json(t, conf) for t in tallies],
                              "signatures": [dataclasses.asdict(s) for s in sigs]}))
            return
        console = Console(width=None if sys.stdout.isatty() else 200)  # logs: no folding
        console.print(literal(store.path) + (f", campaign {campaign}" if campaign is not None else ""),
                      highlight=False)
        table = Table()
        table.add_column("target", overflow="fold", min_width=24)
        table.add_column("variant", overflow="fold")
        for col in ("n", *[o.value for o in OUTCOMES]):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_column("failure rate", justify="right", no_wrap=True)
        for t in tallies:
            table.add_row(literal(t.target), literal(t.variant or "-"), str(t.n), *[str(t.counts[o.value]) for o in OUTCOMES],
                          format_rate(t.failures, t.judged, conf))
        console.print(table if tallies else "no runs stored yet")
        if sigs:
            console.print(f"failure signatures (top {min(len(sigs), TOP_SIGNATURES)} of {len(sigs)}):")
        for s in sigs[:TOP_SIGNATURES]:
            where = item_key(s.target, s.variant)
            console.print(f"  {s.count:>6} x {s.outcome:<8} {where}: {s.message}", highlight=False, markup=False)
