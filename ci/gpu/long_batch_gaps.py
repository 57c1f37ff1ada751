"""The verdict, duration and largest gap between progress events of every run in a store
(ci/gpu/long-batch-beats.sh: one long batch per family, stall detection at its default).

Usage: python3 ci/gpu/long_batch_gaps.py STORE
Exit 1 if any run is a hang; 2 if there is no run, or a run ended sooner than twice the
family window (it could not have stalled falsely: the check proves nothing); else 0.
"""
from __future__ import annotations

import sys
from pathlib import Path

from hazards.engine.stall import FAMILY_STALL_S
from hazards.engine.store import Store


def main(db: str) -> int:
    with Store(Path(db), read_only=True) as store:
        runs = [r.result for r in store.runs()]
    hangs = short = 0
    for r in runs:
        prog = r.evidence.get("progress") or {}
        launches = r.metrics.get("launches", "?")
        # kernel_ms (GPU time of the loop) close to wall_ms: the paced loop kept the GPU fed
        print(f"{r.key:32} {r.outcome.value:8} {r.error_kind or '-':10} {launches!s:>7} launches "
              f"{r.duration_s:6.2f} s  kernel_ms {r.metrics.get('kernel_ms', '-')}  wall_ms "
              f"{r.metrics.get('wall_ms', '-')}  progress events {prog.get('events', 0):4}  "
              f"max gap {float(prog.get('max_gap_s') or 0):.3f} s  {r.reason[:120]}")
        hangs += r.outcome.value == "hang"
        short += r.duration_s < 2 * FAMILY_STALL_S
    print(f"{len(runs)} runs, {hangs} hangs, {short} shorter than 2 x the {FAMILY_STALL_S:g} s window")
    if hangs:
        return 1
    return 2 if short or not runs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
