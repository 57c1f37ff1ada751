"""`hazards explore FAMILY`: hypothesis over a family's parameter space on a leased GPU.

The static model is the two-way oracle (hazards.explore)."""
from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from hazards.cli.app import app
from hazards.cli.options import (LeaseFlags, lease_options, BudgetOption, CampaignNameOption, JsonOption,
                                 launches_option,
                                 parse_duration, timeout_option)
from hazards.engine.errors import check_seconds

_HELP = """Explore a family's parameter space on a leased GPU, holding its static model to its word.

Hypothesis draws parameter points from the family's strategy; each runs on the family's warm
launch server. A point the static model calls safe (or hazardous only on another platform)
must run clean: a failure is a hazard the model missed, or a hardware/compiler surprise. A
point the model calls hazardous must fail within the launches its predicted rate implies: a
clean point is a model gap or a blind harness. Hypothesis shrinks every disagreement to a
minimal point, which is re-measured (`--point-runs`) and printed with its rate per run and per
launch and a `hazards repro --family F --params JSON` line. `hypothesis.target` steers toward
higher observed failure rates (`--no-targeting` turns it off).

Failing points are kept in the example database beside the results store (one per store,
shared with `hazards soak --explore` and the pytest plugin's nightly profile) and replayed
first next time; `--replay` runs only them.

Exit status: 0 the model agreed everywhere; 1 a confirmed disagreement; 2 bad input;
3 nothing could be judged (only errors).

Examples:

    hazards explore pipeline --budget 2m
    hazards explore deadlock --examples 50 --seed 1 --json
    hazards explore pipeline --replay
"""


@app.command("explore", help=_HELP)
@lease_options
def explore_command(
    family: str = typer.Argument(..., help="Family name (see `hazards list`), or ragged_decode (the megakernel target)."),
    budget: BudgetOption = "60s",
    examples: Optional[int] = typer.Option(None, "--examples", show_default="as many as the budget allows",
                                           help="Parameter points (hypothesis examples) to try, at most."),
    replay: bool = typer.Option(False, "--replay", help="Run only the known failing points of the example database."),
    seed: Optional[int] = typer.Option(None, "--seed", show_default="random",
                                       help="Hypothesis seed: the same points again."),
    launches: Annotated[Optional[int], launches_option("the family's")] = None,
    max_launches: int = typer.Option(20_000, "--max-launches",
                                     help="Most launches one point may take to show a predicted failure."),
    point_runs: int = typer.Option(10, "--point-runs", help="Runs that re-measure each minimal disagreeing point."),
    targeting: bool = typer.Option(True, "--targeting/--no-targeting",
                                   help="Steer toward higher observed failure rates (hypothesis.target)."),
    timeout: Annotated[Optional[float], timeout_option("the family's")] = None,
    lease: LeaseFlags = LeaseFlags(),  # --store, --lease-dir, --wait, --exclusive
    name: CampaignNameOption = None,
    json_out: JsonOption = False,
) -> None:
    from hazards.engine.campaign import LeasedCampaign
    from hazards.engine.store import Store
    from hazards.explore import ExploreOptions, explorable, explore_family

    fam, item_for = explorable(family)
    check_seconds(timeout, "--timeout")
    opts = ExploreOptions(budget_s=parse_duration(budget), examples=examples, replay=replay, target=targeting,
                          seed=seed, launches=launches, max_launches=max_launches, point_runs=point_runs,
                          timeout_s=timeout)
    store_path, wait_s = lease.store_path, lease.wait_s
    with Store(store_path) as store:
        db = store.layout.examples
        with LeasedCampaign.acquire(store, "hazards explore", max_gpus=1, wait_s=wait_s,
                                    lock_dir=lease.lock_dir, exclusive=lease.exclusive, without_gpu=True) as frame:
            typer.echo(f"explore {fam.name} on {frame.describe()}", err=True)
            res = explore_family(frame, fam, opts, database_dir=db, campaign_name=name,
                                 item_for=item_for)
    if json_out:
        typer.echo(json.dumps(res.to_json(), default=str))
    else:
        for line in res.lines():
            typer.echo(line)
        typer.echo(f"campaign {res.campaign_id} (hazards report {res.campaign_id} -o report.html)")
    sys.exit(res.exit_code)
