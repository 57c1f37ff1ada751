"""Stands in for `python3 -m hazards.megakernel_layers.faithful --serve` without a GPU: the
real request handling (`faithful.handle`, which takes the gate's `revision` and `plain_launches`
apart from the candidate) over a fake measurement whose rows carry the revision and tree the
request named.

    PYTHONPATH=tests python3 -m gates.fake_layers_server

With `plain_launches` it adds the plain build's `launch` row (faithful.launch_row, from a fake
plain reply): 600 us, times $FAKE_PLAIN_FACTOR_<CANDIDATE> (e.g. FAKE_PLAIN_FACTOR_STEP_P=0.96);
a candidate named in $FAKE_PLAIN_SKIPPED has its row left out, as a revision from before plain
launches does.
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

    def measure(self, cand, workers, launches, cos_min, revision=None, plain_launches=0):
        def draw(v: float) -> float:
            return v * (1.0 + self.rng.gauss(0.0, 0.001))

        common = {"cos": 0.9999, "workers": workers or 132, "candidate": cand.name,
                  **({"revision": revision.commit, "sources": str(revision.standalone)} if revision else {})}
        rows = [{"task_id": t, "task": n, "slowCTA_us": draw(10.0), "wall_us": draw(20.0), "sumCTA_us": draw(500.0),
                 **common} for t, n in ((2, "qkv"), (11, "worker"))]
        skipped = {}
        if plain_launches and cand.name in os.environ.get("FAKE_PLAIN_SKIPPED", "").split(","):
            skipped[FA.LAUNCH_TASK] = "not measured: the plain build from revision abababababab exited (code 2)"
        elif plain_launches:
            factor = float(os.environ.get(f"FAKE_PLAIN_FACTOR_{cand.name.upper()}", "1"))
            shape = {k: 1 for k in FA.SHAPE_KEYS}
            plain = {"cos": 0.99995, "rel_err": 1e-3, "grid": workers or 132, "build": "megakernel_layers-plain",
                     "plain_us": [draw(600.0 * factor) for _ in range(plain_launches)], **shape}
            rows.append(FA.launch_row(plain, {**common, "launches": launches, "shape": shape}, plain_launches, shape))
        return {"rows": rows, "cos": 0.9999, "rel_err": 1e-3, "mismatched": 0, "kernel_us": 400.0,
                "skipped_rows": skipped}


if __name__ == "__main__":
    rows = Rows()
    sys.exit(serve(lambda req: FA.handle(rows, req), {"server": "fake-layers", "pid": os.getpid()}))
