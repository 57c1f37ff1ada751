"""The per-task profiler on the ragged-decode megakernel (H200): decode, overflow, cost, and
the faithful metrics of every perf-gate candidate across worker counts.

    python3 bench/profiler_h200.py [--workers 8,66,132] [--launches 5] [--json OUT]

1. Decode: the production kernel at each worker count, one profiled launch decoded into
   per-task rows (instances, blocks, slowCTA, wall, sumCTA).
2. Overflow on the real ring: the same launch with a ring of 16 spans; the counter must
   equal the spans a full ring recorded, and the decoder must report the difference as
   dropped (never a silent truncation).
3. Cost: the profiled and the unprofiled build, launches interleaved, median kernel time.
4. Candidates: hazards.ragged_decode.faithful.Faithful.measure for every candidate of
   hazards.ragged_decode.candidates at each worker count (cos and the per-task medians).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from hazards.engine import profiler
from hazards.ragged_decode import candidates, kernel, reference
from hazards.ragged_decode.faithful import Faithful


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="8,66,132")
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    t0 = time.monotonic()
    f = Faithful()
    out: dict = {"device": torch.cuda.get_device_name(0), "shape": f.shape(), "decode": {}, "candidates": []}
    gen = torch.Generator().manual_seed(0)
    q, starts, lens = reference.draw_call(f.cfg["lens"], f.cfg["n_q"], f.cfg["hd"], gen, device="cuda")

    print("== 1. decode (production kernel, one launch per worker count)")
    for w in workers:
        h = f.handle(candidates.get("production"), w)
        for _ in range(2):
            kernel.ragged_decode(h, q, starts, lens, out=f.out)
        kernel.ragged_decode(h, q, starts, lens, out=f.out)
        p = kernel.read_profile(h)
        rows = [s.to_json() for s in p.all_stats()]
        print(f"workers {w}: {p.summary()}")
        print(profiler.format_table(rows))
        out["decode"][w] = {"summary": p.summary(), "claimed": p.claimed, "rows": rows}

    print("== 2. overflow on the real ring (capacity 16)")
    w = workers[-1]
    full = kernel.build_sched({}, {"k": f.k, "v": f.v}, f.cfg, 1, grid=w, profile=True, ring_capacity=4096)
    small = kernel.build_sched({}, {"k": f.k, "v": f.v}, f.cfg, 1, grid=w, profile=True, ring_capacity=16)
    kernel.ragged_decode(full, q, starts, lens, out=f.out)
    pf = kernel.read_profile(full)
    kernel.ragged_decode(small, q, starts, lens, out=f.out)
    ps = kernel.read_profile(small)
    ok = ps.claimed == pf.claimed and ps.dropped == pf.claimed - 16 and len(ps.spans) == 16 and pf.complete
    print(f"full ring: {pf.summary()}")
    print(f"ring of 16: {ps.summary()}")
    print(f"overflow accounted: {ok}")
    try:
        profiler.summarize([ps])
        refused = False
    except ValueError as exc:
        refused = True
        print(f"summarize refuses the truncated ring: {exc}")
    out["overflow"] = {"full_claimed": pf.claimed, "small_claimed": ps.claimed, "small_kept": len(ps.spans),
                       "dropped": ps.dropped, "accounted": ok, "summarize_refused": refused}

    print("== 3. cost of the profiler (production, interleaved launches)")
    cost = {}
    for w in workers:
        hp = f.handle(candidates.get("production"), w)
        hn = kernel.build_sched({}, {"k": f.k, "v": f.v}, f.cfg, 1, grid=w)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        tp, tn = [], []
        for _ in range(15):
            ev[0].record(); kernel.ragged_decode(hn, q, starts, lens, out=f.out); ev[1].record()
            ev[2].record(); kernel.ragged_decode(hp, q, starts, lens, out=f.out); ev[3].record()
            torch.cuda.synchronize()
            tn.append(ev[0].elapsed_time(ev[1]) * 1000)
            tp.append(ev[2].elapsed_time(ev[3]) * 1000)
        mn, mp = statistics.median(tn), statistics.median(tp)
        cost[w] = {"unprofiled_us": mn, "profiled_us": mp, "overhead": mp / mn - 1}
        print(f"workers {w}: unprofiled {mn:.1f} us, profiled {mp:.1f} us (+{100 * (mp / mn - 1):.2f}%, "
              "profiled includes the counter memset)")
    out["cost"] = cost

    print("== 4. candidates (faithful metrics, medians of", args.launches, "profiled launches)")
    for name in candidates.CANDIDATES:
        c = candidates.get(name)
        for w in workers:
            res = f.measure(c, w, args.launches, seed=0, cos_min=0.99)
            by = {r["task"]: r for r in res["rows"]}
            a, m, k = by.get("attend"), by.get("merge"), by.get("worker")
            print(f"{name:<11} w={w:>4} cos {res['cos']:.5f} kernel {res['kernel_us']:9.1f} us | attend slow "
                  f"{a['slowCTA_us']:8.1f} wall {a['wall_us']:8.1f} sum {a['sumCTA_us']:10.1f} n {a['instances']:5g}"
                  + (f" | merge slow {m['slowCTA_us']:6.1f} sum {m['sumCTA_us']:8.1f} n {m['instances']:4g}" if m else "")
                  + f" | worker slow {k['slowCTA_us']:8.1f}", flush=True)
            out["candidates"].append({"candidate": name, "workers": w, "cos": res["cos"], "kernel_us": res["kernel_us"],
                                      "rows": res["rows"]})
    out["seconds"] = time.monotonic() - t0
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0 if ok and refused else 1


if __name__ == "__main__":
    sys.exit(main())
