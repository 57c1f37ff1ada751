"""How `hazards bisect` does on simulated histories: right culprits, refusals and runs spent.

The command's own search (`hazards.bisect.search.bisect`) on commits with known failure
rates (`hazards.bisect.simulate`), each run a Bernoulli draw: a history of 24 commits, the
rate jumps at commit 15, commits 4, 9 and 17 do not build. Prints one line per scenario
(the numbers of docs/bisect.md).

    PYTHONPATH=$PWD python3 bench/bisect_sim.py [--reps 200] [--budget 3000]
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

from hazards.bisect.search import bisect
from hazards.bisect.simulate import SimulatedSide, history

COMMITS, CULPRIT, UNBUILDABLE = 24, 15, (4, 9, 17)
SCENARIOS = [(0.0, 1.0), (0.0, 0.5), (0.0, 0.2), (0.0, 0.05), (0.0, 0.02), (0.01, 0.1), (0.02, 0.3),
             (0.05, 0.05), (0.2, 0.2)]  # the last two: no change at all (a refusal is right)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--budget", type=int, default=3000)
    args = ap.parse_args()
    print(f"{COMMITS} commits, culprit {CULPRIT}, unbuildable {UNBUILDABLE}, budget {args.budget} runs, "
          f"{args.reps} seeded repetitions per scenario")
    print("before -> after | right | wrong | refused | undecided | ambiguous | runs: median, 90th pct, max "
          "| runs per tested commit (median)")
    for before, after in SCENARIOS:
        t0 = time.monotonic()
        statuses: collections.Counter = collections.Counter()
        runs, per_commit = [], []
        for seed in range(args.reps):
            b = bisect(COMMITS - 1, SimulatedSide(history(COMMITS, CULPRIT, before, after, UNBUILDABLE), seed),
                       budget=args.budget)
            kind = b.status if b.status != "found" else ("right" if b.culprit == CULPRIT else "wrong")
            statuses[kind] += 1
            runs.append(b.runs)
            per_commit += [j.runs for j in b.judged if j.runs]
        runs.sort()
        print(f"{before:.0%} -> {after:.0%} | {statuses['right']} | {statuses['wrong']} | {statuses['refused']} | "
              f"{statuses['undecided']} | {statuses['ambiguous']} | {statistics.median(runs):.0f}, "
              f"{runs[int(0.9 * len(runs))]}, {runs[-1]} | "
              f"{statistics.median(per_commit) if per_commit else 0:.0f}  ({time.monotonic() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
