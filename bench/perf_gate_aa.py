"""A/A gates of `hazards gate perf` on the layered megakernel: how often
does the gate call a candidate that is the baseline again anything but no-change?

    python3 bench/perf_gate_aa.py --budget-s 200 --out DIR [--max-gates 60]
    python3 bench/perf_gate_aa.py --summarise DIR/gates.jsonl     # the numbers of the results page

Gates run one after another, alternating the issue's two A/A comparisons, each at
`--workers 132 --repeats 10` (the issue's command) and the gate's defaults otherwise:
  noop: --baseline megakernel_layers:production --candidate megakernel_layers:noop
  self: --baseline megakernel_layers:production --candidate megakernel_layers:production
through `hazards.gates.perf.run_gate`, what `hazards gate perf` calls (each gate is its
own campaign: an exclusive lease, a warm server, its runs in a scratch store). A gate starts
only while the budget leaves 1.5x the slowest gate so far. Per gate one JSON line in DIR/gates.jsonl: the kind,
seconds, the verdict and each task's, the verdict of the rule before the fix on the same
pairs (intervals adjusted over the (worker count, task) cells only, which is `evaluate` at
conf 1 - 3 x (1 - conf)), and the raw pairs (which side ran first, every task's metrics).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hazards.gates import perf  # noqa: E402

KINDS = {"noop": ("megakernel_layers:production", "megakernel_layers:noop"),
         "self": ("megakernel_layers:production", "megakernel_layers:production")}
WORKERS, REPEATS = [132], 10


def cells_only_verdict(baseline: str, candidate: str, pairs: list[perf.Pair]) -> str:
    """The verdict under the rule before the family-wise fix (intervals at 1 - (1 - conf)/cells)."""
    old_conf = 1.0 - len(perf.METRICS) * (1.0 - perf.DEFAULT_CONF)
    return perf.evaluate(baseline, candidate, pairs, conf=old_conf)["verdict"]


def raw_pairs(pairs: list[perf.Pair]) -> list[dict[str, Any]]:
    def side(s: perf.Sample) -> dict[str, Any]:
        return {"ok": s.ok, "cos": s.cos,
                "tasks": {str(r.get("task", t)): [r[f"{m}_us"] for m in perf.METRICS] for t, r in s.rows.items()}}
    return [{"workers": p.workers, "seed": p.seed, "baseline_first": perf.baseline_first(p.seed),
             "baseline": side(p.baseline), "candidate": side(p.candidate)} for p in pairs]


def one_gate(kind: str, store: Path) -> dict[str, Any]:
    baseline, candidate = KINDS[kind]
    seen: list[list[perf.Pair]] = []
    evaluate = perf.evaluate

    def keep_pairs(b: str, c: str, pairs: Any, **kw: Any) -> dict[str, Any]:
        seen.append(list(pairs))
        return evaluate(b, c, pairs, **kw)

    perf.evaluate = keep_pairs
    t0 = time.monotonic()
    try:
        res = perf.run_gate(baseline, [candidate], workers=WORKERS, repeats=REPEATS, wait_s=60.0, store_path=store)
    except Exception as exc:  # noqa: BLE001 - a gate that could not judge is a line, not the end
        return {"kind": kind, "seconds": time.monotonic() - t0, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        perf.evaluate = evaluate
    [point] = res["points"]
    return {"kind": kind, "seconds": time.monotonic() - t0, "verdict": res["verdict"],
            "cells_only_verdict": cells_only_verdict(baseline, candidate, seen[0]),
            "interval_conf": res["interval_conf"], "judged_tests": res["judged_tests"],
            "tasks": point.get("tasks", {}),
            "slowCTA": {t: e["slowCTA"] for t, e in point.get("ratios", {}).items()},
            "pairs": raw_pairs(seen[0])}


def summarise(path: Path) -> None:
    """From the raw pairs: the verdicts, how many intervals exclude 1 at the new level, the
    old one and unadjusted (before --min-effect), and what running second in a pair does
    (mean of +-log(candidate/baseline), + when the candidate ran second), per task and metric."""
    import math
    import statistics

    gates = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    judged = [g for g in gates if "verdict" in g]
    print(f"{len(gates)} gates, {len(judged)} judged; seconds per gate: median "
          f"{statistics.median(g['seconds'] for g in gates):.1f}")
    for kind in KINDS:
        gs = [g for g in judged if g["kind"] == kind]
        for rule in ("verdict", "cells_only_verdict"):
            print(f"  {kind:<4} {rule:<18} {sum(g[rule] != 'no-change' for g in gs)} of {len(gs)} not no-change")
    levels = {"new": judged[0]["interval_conf"],
              "cells only": 1.0 - (1.0 - perf.DEFAULT_CONF) / (judged[0]["judged_tests"] // len(perf.METRICS)),
              "unadjusted": perf.DEFAULT_CONF}
    for name, level in levels.items():
        for kind in KINDS:
            out, n = [], 0
            for g in (g for g in judged if g["kind"] == kind):
                for t in g["pairs"][0]["baseline"]["tasks"]:
                    for i, m in enumerate(perf.METRICS):
                        b = [p["baseline"]["tasks"][t][i] for p in g["pairs"]]
                        c = [p["candidate"]["tasks"][t][i] for p in g["pairs"]]
                        if sorted(b)[len(b) // 2] < perf.DEFAULT_MIN_US:
                            continue
                        n += 1
                        iv = perf.ratio_interval(b, c, level)
                        if iv.resolved and (iv.lo > 1 or iv.hi < 1):
                            out.append(f"{t}/{m} {iv.estimate:.3f} [{iv.lo:.3f}, {iv.hi:.3f}]")
            print(f"  intervals excluding 1, {name} ({level:.5f}), {kind}: {len(out)} of {n}"
                  + (f"; largest: {max(out, key=lambda x: abs(float(x.split()[1]) - 1))}" if out else ""))
    print("  running second in a pair (per task: slowCTA, wall, sumCTA; mean, its standard error):")
    for t in judged[0]["pairs"][0]["baseline"]["tasks"]:
        cells = []
        for i, m in enumerate(perf.METRICS):
            xs = [(1 if p["baseline_first"] else -1)
                  * math.log(max(p["candidate"]["tasks"][t][i], 1e-3) / max(p["baseline"]["tasks"][t][i], 1e-3))
                  for g in judged for p in g["pairs"]]
            se = statistics.stdev(xs) / math.sqrt(len(xs))
            cells.append(f"{m} {100 * math.expm1(statistics.mean(xs)):+.2f}% ({100 * se:.2f})")
        print(f"    {t:<12} " + "  ".join(cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--max-gates", type=int, default=60)
    ap.add_argument("--summarise", type=Path, help="print the summary of a gates.jsonl and exit")
    args = ap.parse_args()
    if args.summarise:
        summarise(args.summarise)
        return 0
    if args.budget_s is None or args.out is None:
        ap.error("--budget-s and --out are needed to run gates")
    args.out.mkdir(parents=True, exist_ok=True)
    t0, slowest, failures_in_a_row = time.monotonic(), 0.0, 0
    done: list[dict[str, Any]] = []
    store = Path(tempfile.mkdtemp(prefix="hz-gate-aa-")) / "results.db"  # the gates' runs: not sent back
    with (args.out / "gates.jsonl").open("w") as out:
        while len(done) < args.max_gates and time.monotonic() - t0 + 1.5 * slowest < args.budget_s:
            kind = list(KINDS)[len(done) % len(KINDS)]
            g = one_gate(kind, store)
            slowest = max(slowest, g["seconds"])
            out.write(json.dumps(g) + "\n")
            out.flush()
            done.append(g)
            print(f"gate {len(done)} {kind}: {g.get('verdict', g.get('error'))} "
                  f"(rule before the fix: {g.get('cells_only_verdict', '-')}) in {g['seconds']:.1f} s", flush=True)
            failures_in_a_row = failures_in_a_row + 1 if "error" in g else 0
            if failures_in_a_row >= 2:
                print("two gates in a row could not judge: stopping", flush=True)
                break
    judged = [g for g in done if "verdict" in g]
    print(f"completed {len(done)} gates ({len(judged)} judged) in {time.monotonic() - t0:.0f} s")
    for kind in KINDS:
        gs = [g for g in judged if g["kind"] == kind]
        for rule in ("verdict", "cells_only_verdict"):
            counts: dict[str, int] = {}
            for g in gs:
                counts[str(g[rule])] = counts.get(str(g[rule]), 0) + 1
            false = sum(n for v, n in counts.items() if v != "no-change")
            print(f"  {kind:<4} {rule:<18} {false} of {len(gs)} not no-change  {counts}")
    return 0 if judged else 1


if __name__ == "__main__":
    sys.exit(main())
