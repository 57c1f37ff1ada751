"""Stands in for `python3 -m hazards.megakernel_layers.faithful --serve` without a GPU: the
real request handling (`faithful.handle`, which takes the gate's `revision` apart from the
candidate) over a fake measurement whose rows carry the revision and tree the request named.

    PYTHONPATH=tests python3 -m gates.fake_layers_server
"""
import os
import random
import sys

from hazards.engine.protocol_server import serve
from hazards.megakernel_layers import faithful as FA


class Rows:
    """Two tasks around fixed spans with 0.1% noise, cos 0.9999: any two sides are no-change."""

    def __init__(self) -> None:
        self.rng = random.Random(os.getpid())

    def measure(self, cand, workers, launches, cos_min, revision=None):
        def draw(v: float) -> float:
            return v * (1.0 + self.rng.gauss(0.0, 0.001))

        rows = [{"task_id": t, "task": n, "slowCTA_us": draw(10.0), "wall_us": draw(20.0), "sumCTA_us": draw(500.0),
                 "cos": 0.9999, "workers": workers or 132, "candidate": cand.name,
                 **({"revision": revision.commit, "sources": str(revision.standalone)} if revision else {})}
                for t, n in ((2, "qkv"), (11, "worker"))]
        return {"rows": rows, "cos": 0.9999, "rel_err": 1e-3, "mismatched": 0, "kernel_us": 400.0}


if __name__ == "__main__":
    rows = Rows()
    sys.exit(serve(lambda req: FA.handle(rows, req), {"server": "fake-layers", "pid": os.getpid()}))
