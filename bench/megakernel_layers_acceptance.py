#!/usr/bin/env python3
"""megakernel_layers on one GPU: clean variants over many checked launches, the silent-
corruption canaries' per-launch rates, and the static model against the GPU at extra points.

    PYTHONPATH=$PWD python3 bench/megakernel_layers_acceptance.py [--clean-launches 10000
        --clean-budget 12 --canary-budget 3 --define MKL_CAMPAIGN_STEP=4 --json OUT]

One warm family server (the engine's ServerTarget, docs/protocol.md) serves everything:
  * every clean variant: requests of 1000 checked launches until --clean-launches or
    --clean-budget seconds (what was reached is printed, with the 95% upper bound);
  * every runtime silent-corruption canary and the static-only ones: requests of 20 launches
    for --canary-budget seconds -> mismatched launches / launches with a 95% interval and the
    worst error against the tolerance;
  * agreement points: one request each; the outcome the static model predicts
    (`megakernel_layers.predict`) beside the outcome the GPU gave.
Hangs are `hazards repro`'s job (the tripwire sentence); ci/gpu/megakernel-layers-acceptance.sh runs it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hazards.engine.outcome import Outcome  # noqa: E402
from hazards.engine.stats import describe_rate, rate_ci  # noqa: E402
from hazards.engine.targets import ServerTarget  # noqa: E402
from hazards.families import get_family  # noqa: E402
from hazards.families import megakernel_layers as F  # noqa: E402
from hazards.stress_family import family_binary  # noqa: E402

CORRUPTIONS = ("stale_descriptor", "amax_tail", "dead_flag", "stale_release", "partial_no_fence",
               "routing_no_fence")
# Points beside the variants: (name, params). Predicted outcomes come from the static model.
AGREEMENT = [
    ("none, seq 512, grid 32", {"variant": "clean", "seq": 512, "grid": 32}),
    ("none, small model", {"variant": "clean", "model": "small"}),
    ("none, 1 layer, seq 64", {"variant": "clean", "layers": 1, "seq": 64}),
    ("participant_set, seq 4096 (33 chunks <= 80 tiles)", {"variant": "participant_set", "seq": 4096}),
    ("participant_set, seq 12000 (94 chunks > 80 tiles)", {"variant": "participant_set", "seq": 12000}),
    ("chunk_supply, 64 chunks on 64 workers", {"variant": "chunk_supply", "chunks": 64}),
    ("snapshot_epoch, no skew", {"variant": "snapshot_epoch", "jitter_ppm": 0}),
    ("snapshot_epoch, grid 80 (no worker without a tile)", {"variant": "snapshot_epoch", "grid": 80,
                                                            "jitter_ppm": 20000}),
    ("stale_release, no skew", {"variant": "stale_release", "jitter_ppm": 0}),
    ("stale_release, 1 layer", {"variant": "stale_release", "layers": 1}),
    ("shared_line, no write-back", {"variant": "shared_line", "writeback_ppm": 0}),
    ("stale_descriptor, 1 layer", {"variant": "stale_descriptor", "layers": 1}),
    ("stale_descriptor, small model, 2 layers", {"variant": "stale_descriptor", "model": "small", "layers": 2}),
    ("amax_tail, small model (32 sub-blocks)", {"variant": "amax_tail", "model": "small"}),
    ("amax_tail, 1 layer", {"variant": "amax_tail", "layers": 1}),
    ("dead_flag, 1 layer, small model", {"variant": "dead_flag", "layers": 1, "model": "small"}),
    ("partial_no_fence, seq 16384", {"variant": "partial_no_fence", "seq": 16384}),
]


def tally(target: ServerTarget, params: dict, launches: int, requests: int, budget_s: float,
          timeout: float) -> dict:
    """Requests until `requests` or the budget: launches, mismatched, worst error, outcomes."""
    out = {"launches": 0, "mismatched": 0, "max_rel_err": 0.0, "outcomes": {}, "requests": 0, "reasons": []}
    t0 = time.monotonic()
    while out["requests"] < requests and time.monotonic() - t0 < budget_s:
        r = target.run(params, timeout=timeout, launches=launches)
        out["requests"] += 1
        out["outcomes"][str(r.outcome)] = out["outcomes"].get(str(r.outcome), 0) + 1
        m = r.metrics or {}
        if r.outcome in (Outcome.CLEAN, Outcome.MISMATCH):
            out["launches"] += int(m.get("launches") or 0)
            out["mismatched"] += int(m.get("mismatched") or 0)
            out["max_rel_err"] = max(out["max_rel_err"], float(m.get("max_rel_err") or 0.0))
            out["kernel_ms_per_launch"] = float(m.get("kernel_ms") or 0) / max(1, int(m.get("launches") or 1))
            out["resolved"] = m.get("resolved")
        else:
            out["reasons"].append(r.reason[:300])
            if r.outcome is Outcome.HANG:
                break  # one hang says what a hang says; the budget goes elsewhere
    out["wall_s"] = time.monotonic() - t0
    if out["launches"]:
        lo, hi = rate_ci(out["mismatched"], out["launches"])
        out["rate"] = out["mismatched"] / out["launches"]
        out["ci95"] = [lo, hi]
        out["in_words"] = describe_rate(out["mismatched"], out["launches"], what="mismatched launch")
    return out


def outcome_of(t: dict) -> str:
    if t["outcomes"].get("hang"):
        return "hang"
    if t["mismatched"]:
        return "mismatch"
    if t["outcomes"].get("clean"):
        return "clean"
    return next(iter(t["outcomes"]), "none")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clean-launches", type=int, default=10000)
    ap.add_argument("--clean-budget", type=float, default=12.0, help="seconds per clean variant")
    ap.add_argument("--canary-budget", type=float, default=3.0, help="seconds per corruption canary")
    ap.add_argument("--agreement-timeout", type=float, default=3.0)
    ap.add_argument("--skip-agreement", action="store_true")
    ap.add_argument("--define", action="append", default=[], metavar="NAME=INT",
                    help="a compile-time define of the build judged (e.g. MKL_CAMPAIGN_STEP=4: a campaign "
                         "candidate's kernel); repeatable")
    ap.add_argument("--json", help="write every number here")
    a = ap.parse_args()
    try:
        defines = {name: int(value) for name, _, value in (d.partition("=") for d in a.define)}
    except ValueError:
        ap.error(f"--define takes NAME=INT, got {a.define}")
    fam = get_family("megakernel_layers")
    tol = fam.defaults["tol_e6"] * 1e-6
    exe = family_binary(fam, defines=defines or None)
    print(f"build {exe} (defines {defines or 'none'})", flush=True)
    res: dict = {"tol": tol, "defines": defines, "clean": {}, "canaries": {}, "agreement": []}
    with ServerTarget([str(exe), "--serve"], name="megakernel_layers") as target:
        for v in fam.clean_variants:
            t = tally(target, {"variant": v.name}, 1000, -(-a.clean_launches // 1000), a.clean_budget, 120.0)
            res["clean"][v.name] = t
            print(f"clean {v.name:<14} {t['launches']:>6} launches, {t['mismatched']} mismatched "
                  f"({t.get('in_words', '-')}), worst rel err {t['max_rel_err']:.3g} (tol {tol:g}), "
                  f"{t.get('kernel_ms_per_launch', 0):.3f} ms per checked launch, outcomes {t['outcomes']}",
                  flush=True)
        for name in CORRUPTIONS:
            t = tally(target, {"variant": name}, 20, 1000, a.canary_budget, 60.0)
            t["predicted"] = F.predict({"variant": name}, defines=defines).__dict__
            res["canaries"][name] = t
            print(f"canary {name:<17} {t['mismatched']}/{t['launches']} launches mismatched "
                  f"({t.get('in_words', '-')}); worst rel err {t['max_rel_err']:.3g} = "
                  f"{t['max_rel_err'] / tol:.1f} x tol; predicted p={t['predicted']['probability']:.3g}",
                  flush=True)
        if not a.skip_agreement:
            for label, params in AGREEMENT:
                pr = F.predict(params, defines=defines)  # the judged build's schedule (its QKV tiles)
                t = tally(target, params, 20, 1, 1e9, a.agreement_timeout)
                got = outcome_of(t)
                want = pr.outcome if pr.probability > 0 or pr.outcome in ("clean", "rejected") else "clean"
                row = {"point": label, "params": params, "predicted": pr.outcome, "p": pr.probability,
                       "observed": got, "agree": got == want, "mismatched": t["mismatched"],
                       "launches": t["launches"], "max_rel_err": t["max_rel_err"]}
                res["agreement"].append(row)
                print(f"point {label:<52} predicted {pr.outcome:<8} p={pr.probability:<6.3g} observed {got:<8} "
                      f"{'agree' if row['agree'] else 'DISAGREE'} ({t['mismatched']}/{t['launches']})", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
