#!/usr/bin/env python3
"""Where one decode step of the layered megakernel spends its time: the per-task profiler.

    PYTHONPATH=$PWD python3 bench/megakernel_layers_profile.py [--candidate production ...]
        [--set tripwire=off] [--workers 132] [--launches 5] [--out DIR]

For each candidate (hazards.megakernel_layers.faithful) the profiled binary checks one
launch and profiles `--launches` more. Printed per candidate:
  * the FAITHFUL_RESULT metrics per task id (medians over the launches);
  * per layer of the median launch, each task's window (first stamp to last record, in us
    from the launch's first stamp), the bytes the task streams and the rate its window
    implies, and what lies between the windows (barrier hops, waits, serial tasks);
  * each layer's head: from the previous layer's last W2 record (every W2 row arrived) to
    the merge's release -- a worker skewed at the layer boundary for longer than this
    snapshots an already-bumped ATTN_RELEASE (the snapshot_epoch model's LAYER_HEAD_US).
Raw rings (the binary's file) and every number go to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hazards.engine import profiler  # noqa: E402
from hazards.megakernel_layers import faithful as FA  # noqa: E402
from hazards.megakernel_layers import model as M  # noqa: E402

ORDER = (2, 3, 4, 5, 6, 7, 8)  # a layer's tasks in schedule order (MklTask ids)


def task_bytes(reply: dict) -> dict[int, float]:
    """Bytes each task kind streams per layer (weights, KV), default or small shape."""
    s = M.SHAPES[reply["resolved"]["model"]]
    tokens = reply["seq"] + 1
    return {2: M.qkv_rows(s) * s.D * 2, 3: 2 * tokens * s.NKV * M.HD * 2, 5: s.D * s.NQ * M.HD * 2,
            6: s.E * s.D * 2, 7: s.K * 2 * s.I * s.D * 2, 8: s.K * s.D * s.I * 2}


def timeline(prof: profiler.Profile, layers: int) -> dict[int, dict[int, tuple[float, float, int]]]:
    """{layer: {task: (first begin, last end, instances)}} in us from the launch's first stamp."""
    t0 = min(sp.begin for sp in prof.spans)
    out: dict[int, dict[int, list]] = {}
    for sp in prof.spans:
        if sp.task not in ORDER:
            continue
        layer = sp.aux >> 32
        w = out.setdefault(layer, {}).setdefault(sp.task, [sp.begin, sp.end, 0])
        w[0], w[1], w[2] = min(w[0], sp.begin), max(w[1], sp.end), w[2] + 1
    return {l: {t: ((b - t0) / 1e3, (e - t0) / 1e3, n) for t, (b, e, n) in tasks.items()}
            for l, tasks in sorted(out.items()) if l < layers}


def report(name: str, reply: dict, profiles: list, rows: list[dict]) -> dict:
    names = FA.task_names(reply["task_names"])
    kus = reply["kernel_us"]
    median_i = sorted(range(len(kus)), key=lambda i: kus[i])[len(kus) // 2]
    tl = timeline(profiles[median_i], reply["layers"])
    nbytes = task_bytes(reply)
    print(f"\n== {name}: {reply['grid']} workers, {reply['chunks']} chunks, gemv_depth {reply['gemv_depth']}, "
          f"tripwire {reply['tripwire']}; kernel {statistics.median(kus):.1f} us per launch (events; median of "
          f"{len(kus)}); cos {reply['cos']:.6f}, rel err {reply['rel_err']:.3g}")
    print(profiler.format_table(rows))
    heads, layer_us = [], []
    prev_w2_end = last_end = None
    for layer, tasks in tl.items():
        print(f"  layer {layer}:")
        for t in ORDER:
            if t not in tasks:
                continue
            b, e, n = tasks[t]
            gap = f"  (+{b - last_end:6.1f} us after the previous window)" if last_end is not None else ""
            rate = f"  {nbytes[t] / 1e6:6.1f} MB -> {nbytes[t] / ((e - b) * 1e-6) / 1e12:5.2f} TB/s" \
                if t in nbytes and e > b else ""
            print(f"    {names.get(t, t):<12} {b:8.1f} .. {e:8.1f}  {e - b:7.1f} us  x{n:<4}{rate}{gap}")
            last_end = e
        if prev_w2_end is not None and 4 in tasks:
            heads.append(tasks[4][1] - prev_w2_end)
        if 8 in tasks:
            layer_us.append(tasks[8][1] - (prev_w2_end if prev_w2_end is not None else 0.0))
            prev_w2_end = tasks[8][1]
    if heads:
        print(f"  layer head (previous layer's last W2 record -> merge released): "
              f"{', '.join(f'{h:.1f}' for h in heads)} us")
    print(f"  layer time (W2 end to W2 end): {', '.join(f'{x:.1f}' for x in layer_us)} us")
    return {"candidate": name, "reply": {k: v for k, v in reply.items() if k != "resolved"},
            "resolved": reply.get("resolved"), "rows": rows, "timeline": {str(l): {names.get(t, str(t)): v
                                                                                  for t, v in tasks.items()}
                                                                      for l, tasks in tl.items()},
            "heads_us": heads, "layer_us": layer_us, "median_launch": median_i}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidate", action="append", help=f"repeatable; one of {', '.join(FA.CANDIDATES)}")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="another request field for every candidate (e.g. tripwire=off)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--out", type=Path, help="raw rings and the JSON go here")
    a = ap.parse_args()
    extra = {}
    for item in a.set:
        k, _, v = item.partition("=")
        extra[k] = int(v) if v.lstrip("-").isdigit() else v
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    f = FA.Faithful()
    results = []
    try:
        for name in a.candidate or ["production"]:
            cand = FA.candidate(name)
            label = name + "".join(f",{k}={v}" for k, v in extra.items())
            ring = (a.out / f"ring_{label.replace(',', '_').replace('=', '-')}.bin") if a.out else None
            reply, profiles = f.profile(cand, a.workers, a.launches, ring=ring, params=extra)
            bad = [p.summary() for p in profiles if not p.complete]
            if bad:
                print(f"{label}: incomplete profile: {bad[0]}")
                return 2
            results.append(report(label, reply, profiles, profiler.summarize(profiles)))
    finally:
        f.close()
    if a.out:
        (a.out / "profile.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
