"""Does `hypothesis.target` help `hazards explore` find a narrow failing region? (needs a GPU)

For each seed, the same explore runs twice on one warm launch server: with `hypothesis.target`
on the observed failure rate per launch, and without it. Hypothesis generates the same points
for one seed in both modes until targeting starts (after half of `--examples`), so the seeds
pair the two modes. Each search stops at the first point whose observed failure rate reaches
`--stop-rate`, or after `--examples` points (censored). Reported per mode: examples to the
first point that failed at all, and to the first that failed at `--stop-rate` or more; the
paired comparison (seeds where targeting was sooner / later / the same, two-sided sign test).

Regions (a family variant with some parameters drawn, the rest as the variant has them):

  pipeline-war   pipeline `fixed_pingpong` with the WAR barrier removed: stages 2-4, copy
                 kind, trip count, jitter 0-64, grid drawn. The refill races slow warps
                 only when jitter desynchronises them: the failure rate per launch grows with
                 jitter (the model does not rate it).
  deadlock-epoch deadlock `broken_epoch` over workers, participants, layers and skew_ppm
                 0-2000: the hang's rate per launch grows with skew and non-participants.

Usage: python3 bench/explore_targeting.py [--region pipeline-war] [--seeds 20] [--examples 100]
           [--launches 20] [--stop-rate 0.5] [--timeout S] [--budget S] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import strategies as st  # noqa: E402

from hazards.explore import ExploreOptions, explore_family  # noqa: E402
from hazards.families import get_family  # noqa: E402
from hazards.engine.campaign import LeasedCampaign  # noqa: E402
from hazards.engine.store import Store  # noqa: E402
from bench.bench_json import save_json  # noqa: E402


def regions() -> dict[str, tuple[str, object]]:
    """{name: (family, strategy of points)}."""
    war = st.fixed_dictionaries({
        "variant": st.just("fixed_pingpong"), "war_barrier": st.just(False),
        "stages": st.integers(2, 4), "copy": st.sampled_from(["plain", "cp_async"]),
        "ktiles": st.integers(1, 64), "jitter": st.integers(0, 64), "blocks": st.integers(1, 264)})
    epoch = st.integers(2, 96).flatmap(lambda w: st.fixed_dictionaries({
        "variant": st.just("broken_epoch"), "workers": st.just(w), "participants": st.integers(1, w),
        "layers": st.integers(1, 12), "skew_ppm": st.integers(0, 2000)}))
    return {"pipeline-war": ("pipeline", war), "deadlock-epoch": ("deadlock", epoch)}


def first(observations: list, rate: float) -> int | None:
    """The example number of the first point whose observed failure rate reached `rate` (any
    failure for rate 0)."""
    for o in observations:
        if o.failed and o.observed_rate >= rate:
            return o.index
    return None


def sign_test(sooner: int, later: int) -> float:
    """Two-sided sign test p over the seeds where the modes differed."""
    from scipy.stats import binomtest

    n = sooner + later
    return float(binomtest(sooner, n).pvalue) if n else 1.0


def summary(values: list[int | None], cap: int) -> dict:
    found = [v for v in values if v is not None]
    capped = [v if v is not None else cap + 1 for v in values]
    return {"found": len(found), "of": len(values), "median": statistics.median(capped),
            "mean_censored_at_cap_plus_1": statistics.fmean(capped), "values": values}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--region", default="pipeline-war", choices=sorted(regions()))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--stop-rate", type=float, default=0.5)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run (default: the family's)")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds for all searches (both modes)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    fam_name, strategy = regions()[args.region]
    fam = get_family(fam_name)
    rows: list[dict] = []
    t_end = time.monotonic() + args.budget
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "targeting.db") as store, \
            LeasedCampaign.acquire(store, "bench explore_targeting", max_gpus=1, wait_s=60) as frame:
        print(f"region {args.region} on {frame.describe()}", flush=True)
        for seed in range(args.seeds):
            for targeted in (True, False):
                left = t_end - time.monotonic()
                if left <= 1:
                    break
                opts = ExploreOptions(budget_s=left, examples=args.examples, seed=seed, target=targeted,
                                      launches=args.launches, timeout_s=args.timeout, point_runs=0,
                                      stop_at_rate=args.stop_rate, strategy=strategy)
                t0 = time.monotonic()
                res = explore_family(frame, fam, opts, database_dir=Path(tmp) / "db")
                row = {"seed": seed, "targeted": targeted, "examples": len(res.observations),
                       "first_failure": first(res.observations, 0.0),
                       "first_at_stop_rate": first(res.observations, args.stop_rate),
                       "runs": res.totals()["runs"], "launches": res.totals()["launches"],
                       "seconds": time.monotonic() - t0, "stop": res.stop_reason, "error": res.error}
                rows.append(row)
                print(json.dumps(row), flush=True)
    complete = sorted({r["seed"] for r in rows if r["targeted"]} & {r["seed"] for r in rows if not r["targeted"]})
    by = {(r["seed"], r["targeted"]): r for r in rows}
    out: dict = {"region": args.region, "family": fam_name, "examples_cap": args.examples,
                 "launches_per_run": args.launches, "stop_rate": args.stop_rate, "seeds": complete, "rows": rows}
    for metric in ("first_failure", "first_at_stop_rate"):
        t = [by[(s, True)][metric] for s in complete]
        u = [by[(s, False)][metric] for s in complete]
        cap = args.examples + 1
        sooner = sum(1 for a, b in zip(t, u) if (a or cap) < (b or cap))
        later = sum(1 for a, b in zip(t, u) if (a or cap) > (b or cap))
        out[metric] = {"targeted": summary(t, args.examples), "untargeted": summary(u, args.examples),
                       "targeted_sooner": sooner, "targeted_later": later, "same": len(complete) - sooner - later,
                       "sign_test_p": sign_test(sooner, later)}
        print(f"{metric}: targeted median {out[metric]['targeted']['median']} (found {len(t) - t.count(None)}/"
              f"{len(t)}), untargeted median {out[metric]['untargeted']['median']} (found "
              f"{len(u) - u.count(None)}/{len(u)}); targeting sooner on {sooner}, later on {later} seeds, "
              f"sign test p={out[metric]['sign_test_p']:.3g}")
    save_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
