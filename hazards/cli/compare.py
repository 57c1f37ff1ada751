"""`hazards compare`: did a change fix the hazard? Before/after failure counts in words."""
from __future__ import annotations

import json
import re
import sys
from typing import Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import ConfOption, JsonOption, StoreOption
from hazards.engine.errors import EXIT_HAZARD, EXIT_OK, UserError
from hazards.engine.stats import compare
from hazards.engine.store import Store

_KN = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_k_of_n(text: str, option: str) -> tuple[int, int]:
    """'4/7' -> (4, 7); UserError for anything else (k > n, n == 0, not two integers)."""
    m = _KN.match(text or "")
    if not m:
        raise UserError(f"{option} must be FAILURES/RUNS such as 4/7, got {text!r}")
    k, n = int(m.group(1)), int(m.group(2))
    if n == 0:
        raise UserError(f"{option} {text}: the number of runs must be at least 1")
    if k > n:
        raise UserError(f"{option} {text}: more failures than runs")
    return k, n


def campaign_k_of_n(store: Store, campaign_id: int) -> tuple[int, int]:
    """Hazards (hang + fault + mismatch) and judged runs (all but `error`) of a campaign."""
    store.campaign(campaign_id)
    t = store.counts(campaign_id)
    k = t["hang"] + t["fault"] + t["mismatch"]
    n = sum(t.values()) - t["error"]
    if n == 0:
        raise UserError(f"campaign {campaign_id} has no judged runs to compare")
    return k, n


_HELP = """Compare failure counts before and after a change and say what they show.

One-sided Fisher and Boschloo tests for a drop, the after-rate with its bound, and how many
clean runs would bound it below `--bound`. Campaign counts are hang + fault + mismatch over
all runs that are not `error`. Give each side as counts (`--before K/N`) or as a stored
campaign (`--before-campaign ID`).

Exit status: 0 the rate did not rise significantly (dropped, or no significant change); 1 it
rose significantly (one-sided Fisher p below 1 - `--conf`): a regression; 2 bad input.

Example:

    hazards compare --before 4/7 --after 0/10

prints "rate dropped (p=0.015); after-rate ≤ 26% (95% upper bound): not yet evidence of a
fix, 299 clean runs bound it below 1% (289 more)".
"""


@app.command("compare", help=_HELP)
def compare_command(
    before: Optional[str] = typer.Option(None, "--before", show_default="none",
                                         help="Failures/runs before the change, e.g. 4/7."),
    after: Optional[str] = typer.Option(None, "--after", show_default="none",
                                        help="Failures/runs after the change, e.g. 0/10."),
    before_campaign: Optional[int] = typer.Option(None, "--before-campaign", show_default="none",
                                                  help="Stored campaign before the change."),
    after_campaign: Optional[int] = typer.Option(None, "--after-campaign", show_default="none",
                                                 help="Stored campaign after the change."),
    conf: ConfOption = 0.95,
    bound: float = typer.Option(0.01, "--bound", help="The after-rate a fix must be shown to stay below."),
    json_out: JsonOption = False,
    store_path: StoreOption = None,
) -> None:
    if not 0 < conf < 1:
        raise UserError(f"--conf must be between 0 and 1, got {conf:g}")
    if not 0 < bound < 1:
        raise UserError(f"--bound must be between 0 and 1, got {bound:g}")
    if (before is None) == (before_campaign is None) or (after is None) == (after_campaign is None):
        raise UserError("give exactly one of --before K/N and --before-campaign ID, and one of "
                        "--after K/N and --after-campaign ID")
    kb_nb = parse_k_of_n(before, "--before") if before is not None else None
    ka_na = parse_k_of_n(after, "--after") if after is not None else None
    if kb_nb is None or ka_na is None:
        with Store(store_path, read_only=True) as store:
            kb_nb = kb_nb or campaign_k_of_n(store, before_campaign)  # type: ignore[arg-type]
            ka_na = ka_na or campaign_k_of_n(store, after_campaign)  # type: ignore[arg-type]
    c = compare(*kb_nb, *ka_na, conf=conf, rate_bound=bound)
    if json_out:
        d = c.to_json()
        d.update({"before_campaign": before_campaign, "after_campaign": after_campaign})
        print(json.dumps(d))
    else:
        print(f"before {c.k_before}/{c.n_before}, after {c.k_after}/{c.n_after} "
              f"(one-sided Fisher p={c.fisher_p_one_sided:.3g} for a drop, {c.fisher_p_rose:.3g} for a rise; "
              f"Boschloo p={c.boschloo_p:.3g} for a drop)")
        print(c.verdict)
    sys.exit(EXIT_HAZARD if c.rose else EXIT_OK)  # main() keeps SystemExit codes
