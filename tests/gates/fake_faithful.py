"""A fake faithful check: prints FAITHFUL_RESULT lines with metrics drawn around given values.

    fake_faithful.py --slow 100 --wall 300 --sum 5000 [--noise 0.01] [--cos 0.999] [--workers N]

Each run draws multiplicative noise exp(N(0, noise)) per metric from a generator seeded by
$HZ_GATE_SEED and the role, plus a drift shared by both sides of a pair (seeded by the pair
only), as a GPU's clocks would give. `--scale-by-workers` divides slow/wall by the worker
count relative to 64 (a kernel whose speed depends on the grid). `--crash` exits by SIGSEGV;
`--malformed` prints a line without its cos; `--no-lines` prints nothing.
"""
import argparse
import json
import math
import os
import random
import signal
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="x")
    ap.add_argument("--slow", type=float, required=True)
    ap.add_argument("--wall", type=float, required=True)
    ap.add_argument("--sum", type=float, required=True)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--cos", type=float, default=0.9995)
    ap.add_argument("--workers", default=None)
    ap.add_argument("--faster-above", type=int, default=None,
                    help="slow/wall x0.8 when workers > this, x1.2 otherwise (a grid-dependent kernel)")
    ap.add_argument("--crash", action="store_true")
    ap.add_argument("--malformed", action="store_true")
    ap.add_argument("--no-lines", action="store_true")
    args = ap.parse_args()
    workers = int(args.workers or os.environ["HZ_NUM_WORKERS"])
    seed = int(os.environ.get("HZ_GATE_SEED", "0"))
    if args.crash:
        os.kill(os.getpid(), signal.SIGSEGV)
    if args.no_lines:
        return 0
    drift = random.Random(1000 + seed).gauss(0.0, 0.05)  # shared by both sides of the pair
    rng = random.Random(f"{args.role}-{seed}-{workers}")
    k = 1.0
    if args.faster_above is not None:
        k = 0.8 if workers > args.faster_above else 1.2

    def draw(v: float) -> float:
        return v * math.exp(drift + rng.gauss(0.0, args.noise))

    row = {"task_id": 2, "task": "attend", "slowCTA_us": draw(args.slow * k), "wall_us": draw(args.wall * k),
           "sumCTA_us": draw(args.sum), "cos": args.cos, "workers": workers,
           "shape": {"B": 4}, "build": f"fake-{args.role}"}
    if args.malformed:
        del row["cos"]
    tiny = {**row, "task_id": 4, "task": "fill", "slowCTA_us": 0.032, "wall_us": 0.032, "sumCTA_us": 0.032}
    other = {**row, "task_id": 3, "task": "merge", "slowCTA_us": draw(20.0), "wall_us": draw(40.0),
             "sumCTA_us": draw(500.0)}  # a co-resident task the candidates do not change
    print("some log line")
    for r in (row, other, tiny):
        print("FAITHFUL_RESULT " + json.dumps(r))
    return 1 if args.cos < 0.99 else 0


if __name__ == "__main__":
    sys.exit(main())
