"""Weak outcomes of the MP litmus test without fences, with and without each incantation.

Needs a GPU. Runs family `ordering` through its warm server (hazards.engine.targets.ServerTarget);
every configuration is measured for at most --seconds (or --launches launches), and the
weak rate is reported per 100k instances with an exact 95% CI (hazards.engine.stats.rate_ci) and
as a ratio to the no-incantation baseline. Phases:

  A  each incantation alone, then all together (mp_plain)
  B  stress tuning: stress blocks x access pattern x scratch lines (with the spin barrier)
  C  confirmation on fresh seeds: baseline vs the best B configuration, larger samples,
     and mp_fenced under the best configuration (must be 0)
  D  the other shapes without fences (SB, LB, CoRR) and pc without the release fence,
     under the baseline and the best configuration: allowed-but-rare behaviours measured

Caveat: instances of one launch are not independent (they share a launch's timing), so
the per-instance CI is optimistic; the per-launch rate (also printed) is the conservative
unit.

Usage: python3 bench/litmus_incantations.py [--seconds 1.5] [--launches 2000] [--json PATH]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hazards.families import get_family  # noqa: E402
from hazards.stress_family import family_binary  # noqa: E402
from hazards.engine.outcome import Outcome  # noqa: E402
from hazards.engine.stats import rate_ci  # noqa: E402
from hazards.engine.targets import ServerTarget  # noqa: E402
from bench.bench_json import save_json  # noqa: E402

# 264 stress blocks + 132 test blocks fit the 792 co-resident blocks of 256 threads the
# litmus kernel gets on an H200 (6 per SM); 792 stress blocks would be a bad request.
STRESS = {"stress_blocks": 264, "stress_lines": 64, "stress_pattern": "st_st", "stress_iters": 1024}
# The family's litmus presets carry the tuned stress; the sweep switches it off explicitly.
NO_INCANTATIONS = {"barrier": False, "stress_blocks": 0, "shuffle": False, "permute": False,
                   "pre_stress": 0, "stride": 1}
INCANTATIONS: dict[str, dict[str, Any]] = {
    "none": {},
    "barrier": {"barrier": True},
    "shuffle": {"shuffle": True},
    "permute": {"permute": True},
    "stride32": {"stride": 32},
    "pre_stress": {"pre_stress": 256},
    "stress": dict(STRESS),
    "all": {"barrier": True, "shuffle": True, "permute": True, "pre_stress": 256, **STRESS},
}


def measure(target: ServerTarget, params: dict[str, Any], seconds: float, max_launches: int,
            batch: int = 100) -> dict[str, Any]:
    launches = mismatched = 0
    weak = instances = 0.0
    t0 = time.perf_counter()
    while launches < max_launches and time.perf_counter() - t0 < seconds:
        r = target.run(params, timeout=120.0, launches=batch)
        if r.outcome not in (Outcome.CLEAN, Outcome.MISMATCH):
            return {"params": params, "error": f"{r.outcome}: {r.reason}"}
        m = r.metrics
        launches += int(m["launches"])
        mismatched += int(m["mismatched"])
        weak += float(m.get("weak", 0))
        instances += float(m.get("instances", 0))
    lo, hi = rate_ci(int(weak), int(instances))
    llo, lhi = rate_ci(mismatched, launches)
    return {"params": params, "launches": launches, "mismatched_launches": mismatched,
            "launch_rate": mismatched / launches, "launch_rate_ci95": [llo, lhi],
            "instances": instances, "weak": weak, "per_100k": 1e5 * weak / instances,
            "per_100k_ci95": [1e5 * lo, 1e5 * hi], "seconds": time.perf_counter() - t0}


def line(name: str, row: dict[str, Any], base: float | None) -> str:
    if "error" in row:
        return f"{name:<34} ERROR {row['error']}"
    ratio = f"{row['per_100k'] / base:7.2f}x" if base else "      -"
    lo, hi = row["per_100k_ci95"]
    return (f"{name:<34} {row['weak']:>9.0f} / {row['instances']:>12.4g}  {row['per_100k']:>9.3f} "
            f"[{lo:.3f}, {hi:.3f}]  {ratio}  launches {row['mismatched_launches']}/{row['launches']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.5, help="time cap per configuration")
    ap.add_argument("--launches", type=int, default=2000, help="launch cap per configuration")
    ap.add_argument("--confirm-seconds", type=float, default=4.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    fam = get_family("ordering")
    exe = family_binary(fam).resolve()
    results: dict[str, Any] = {"A": {}, "B": {}, "C": {}, "D": {}}
    header = f"{'configuration':<34} {'weak':>9} / {'instances':>12}  {'per 100k':>9} [95% CI]  vs none"
    with ServerTarget([str(exe), "--serve"], name="ordering") as t:
        t.run({"variant": "mp_plain"}, timeout=60, launches=10)  # warm-up
        print("A: each incantation (mp_plain)\n" + header)
        for name, extra in INCANTATIONS.items():
            results["A"][name] = measure(t, {"variant": "mp_plain", **NO_INCANTATIONS, **extra},
                                         args.seconds, args.launches)
            print(line(name, results["A"][name], results["A"]["none"].get("per_100k")), flush=True)
        print("\nB: stress tuning (mp_plain, barrier on)\n" + header)
        for blocks in (264, 528):
            for pattern in ("st_st", "st_ld", "ld_st", "ld_ld"):
                for lines in (1, 64):
                    name = f"stress {blocks}b {pattern} {lines}l"
                    p = {"variant": "mp_plain", **NO_INCANTATIONS, "barrier": True, "stress_blocks": blocks,
                         "stress_pattern": pattern, "stress_lines": lines, "stress_iters": 1024}
                    results["B"][name] = measure(t, p, args.seconds, args.launches)
                    print(line(name, results["B"][name], results["A"]["none"].get("per_100k")), flush=True)
        ok_b = {k: v for k, v in results["B"].items() if "error" not in v}
        top = sorted(ok_b, key=lambda k: -ok_b[k]["per_100k"])[:2]
        for name in top:  # the stress winners combined with the other incantations
            for extra_name, extra in (("+shuffle", {"shuffle": True}), ("+pre_stress", {"pre_stress": 256})):
                combo = f"{name} {extra_name}"
                results["B"][combo] = measure(t, {**ok_b[name]["params"], **extra}, args.seconds, args.launches)
                print(line(combo, results["B"][combo], results["A"]["none"].get("per_100k")), flush=True)
        ok_b = {k: v for k, v in results["B"].items() if "error" not in v}
        best = max(ok_b, key=lambda k: ok_b[k]["per_100k"]) if ok_b else None
        print(f"\nC: confirmation on fresh seeds ({args.confirm_seconds:g} s each); best B: {best}\n" + header)
        base = measure(t, {"variant": "mp_plain", **NO_INCANTATIONS}, args.confirm_seconds, 10 ** 7)
        results["C"]["none"] = base
        print(line("none", base, None), flush=True)
        if best:
            bp = dict(ok_b[best]["params"])
            results["C"]["best"] = measure(t, bp, args.confirm_seconds, 10 ** 7)
            print(line(f"best: {best}", results["C"]["best"], base["per_100k"]), flush=True)
            # the ratio's conservative bound: best's lower CI end over the baseline's upper end
            bound = results["C"]["best"]["per_100k_ci95"][0] / max(base["per_100k_ci95"][1], 1e-300)
            results["C"]["ratio_lower_bound"] = bound
            print(f"tuned / none >= {bound:.3g}x (95% CI ends; the baseline's weak count is "
                  f"{base['weak']:.0f} in {base['instances']:.3g} instances)", flush=True)
            fenced = {**bp, "variant": "mp_fenced"}
            results["C"]["mp_fenced_best"] = measure(t, fenced, args.confirm_seconds, 10 ** 7)
            print(line("mp_fenced under best", results["C"]["mp_fenced_best"], None), flush=True)
        print("\nD: other shapes without fences\n" + header)
        extra = {k: v for k, v in (ok_b[best]["params"] if best else {}).items() if k != "variant"}
        for name, p in (("sb_plain", {"test": "sb", "writer_sync": "none", "reader_sync": "none"}),
                        ("lb_plain", {"test": "lb", "writer_sync": "none", "reader_sync": "none"}),
                        ("corr", {"variant": "corr"}),
                        ("pc_no_release", {"test": "pc", "writer_sync": "none", "reader_sync": "acquire"})):
            for cond, add in (("none", {}), ("best", extra)):
                if p.get("test") == "pc" and cond == "best":
                    continue  # pc has no litmus incantations
                q = {"variant": "mp_fenced", **NO_INCANTATIONS, **p, **add}
                results["D"][f"{name} {cond}"] = measure(t, q, args.seconds, args.launches)
                print(line(f"{name} {cond}", results["D"][f"{name} {cond}"], None), flush=True)
    save_json(args.json, results)


if __name__ == "__main__":
    main()
