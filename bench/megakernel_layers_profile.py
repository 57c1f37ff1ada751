#!/usr/bin/env python3
"""Where one decode step of the layered megakernel spends its time: the per-task profiler.

    PYTHONPATH=$PWD python3 bench/megakernel_layers_profile.py [--candidate production ...]
        [--set tripwire=off] [--define MKL_PREFETCH_W2_KB=0] [--workers 132] [--launches 5] [--subspans]
        [--out DIR]

For each candidate (hazards.megakernel_layers.faithful) the profiled binary checks one
launch and profiles `--launches` more. Printed per candidate:
  * the FAITHFUL_RESULT metrics per task id (medians over the launches);
  * per layer of the median launch, each task's window (first stamp to last record, in us
    from the launch's first stamp), the bytes the task streams and the rate its window
    implies, and what lies between the windows (barrier hops, waits, serial tasks);
  * each layer's head: from the previous layer's last W2 record (every W2 row arrived) to
    the merge's release -- a worker skewed at the layer boundary for longer than this
    snapshots an already-bumped ATTN_RELEASE (the snapshot_epoch model's LAYER_HEAD_US).
With --subspans the binary is built with MKL_PROF_SUBSPANS=1 and the tasks also record their
time points (megakernel_layers_names.h MklSubPoint): per layer of the median launch and per task,
each sub-span's mean over the task's instances (blocks) and its slowest instance, e.g.
"attn_chunk  wait 2.0/4.1  q_copy 1.2/1.5  loop_w0 21.3/24.0 ...", then the same over every layer
and launch. A sub-span build's stamps cost time of their own: read its task spans beside a plain
run's, not instead of them. Raw rings (the binary's file) and every number go to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
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


def subspan_stats(subspans: list) -> dict[int, dict[int, dict[int, dict]]]:
    """{layer: {task: {point: {mean_us, max_us, n, slow_block}}}} of sub-span records
    (hazards.engine.profiler.SubSpan): the mean over the task's instances and the slowest one."""
    groups: dict[tuple[int, int, int], list] = {}
    for s in subspans:
        groups.setdefault((s.aux >> 32, s.task, s.point), []).append(s)
    out: dict[int, dict[int, dict[int, dict]]] = {}
    for (layer, task, point), ss in sorted(groups.items()):
        slow = max(ss, key=lambda s: s.duration)
        out.setdefault(layer, {}).setdefault(task, {})[point] = {
            "mean_us": sum(s.duration for s in ss) / len(ss) / 1e3, "max_us": slow.duration / 1e3, "n": len(ss),
            "slow_block": slow.block}
    return out


def subspan_line(task_name: str, points: dict[int, dict], names: list[str]) -> str:
    """One task's sub-spans: `name mean/slowest` in point order (us), instances in brackets."""
    parts = []
    for k, st in sorted(points.items()):
        label = names[k - 1] if 0 < k <= len(names) else f"p{k}"
        parts.append(f"{label} {st['mean_us']:.1f}/{st['max_us']:.1f}" + (f" x{st['n']}" if st["n"] != 1 else ""))
    return f"    {task_name:<12} " + "  ".join(parts)


def report_subspans(reply: dict, profiles: list, median_i: int, names: dict[int, str]) -> dict:
    """Print the median launch's sub-spans per layer and task, then every launch's and layer's together."""
    sub_names = FA.subspan_names(reply["subspan_names"]) if reply.get("subspan_names") else {}
    per_layer = subspan_stats(profiles[median_i].subspans)
    print("  sub-spans (us: mean over instances / slowest instance; xN instances when not 1), median launch:")
    if dropped := sum(p.subspans_dropped for p in profiles):
        print(f"  INCOMPLETE: {dropped} sub-spans dropped over {len(profiles)} launches (a parent task id >= 256 or a point >= 128: "
              "hazards.engine.profiler.Profile.subspans_dropped)")
    for layer, tasks in per_layer.items():
        if layer >= reply["layers"]:
            continue
        print(f"   layer {layer}:")
        for t in ORDER:
            if t in tasks:
                print(subspan_line(names.get(t, str(t)), tasks[t], sub_names.get(t, [])))
    everything = subspan_stats([dataclasses.replace(s, aux=s.aux & 0xFFFFFFFF) for p in profiles for s in p.subspans])
    if everything:
        print(f"   every layer of all {len(profiles)} launches:")
        for t in ORDER:
            if t in everything.get(0, {}):
                print(subspan_line(names.get(t, str(t)), everything[0][t], sub_names.get(t, [])))
    return {"names": {str(t): v for t, v in sub_names.items()},
            "median_launch": {str(l): {names.get(t, str(t)): {str(k): v for k, v in pts.items()}
                                       for t, pts in tasks.items()} for l, tasks in per_layer.items()},
            "all": {names.get(t, str(t)): {str(k): v for k, v in pts.items()}
                    for t, pts in everything.get(0, {}).items()}}


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
    subs = report_subspans(reply, profiles, median_i, names) if any(p.subspans for p in profiles) else None
    return {"candidate": name, **({"subspans": subs} if subs else {}), "reply": {k: v for k, v in reply.items() if k != "resolved"},
            "resolved": reply.get("resolved"), "rows": rows, "timeline": {str(l): {names.get(t, str(t)): v
                                                                                  for t, v in tasks.items()}
                                                                      for l, tasks in tl.items()},
            "heads_us": heads, "layer_us": layer_us, "median_launch": median_i}


def build_defines(items: list[str]) -> tuple[tuple[str, int], ...]:
    """--define NAME=INT items as (name, value) pairs, each read by the logit gate's parser (parse_defines);
    anything else is a UserError (one line)."""
    from hazards.engine.errors import UserError
    from hazards.gates.synthlm.megakernel import parse_defines

    out = []
    for item in items:
        try:
            parsed = parse_defines(item)
        except UserError:
            parsed = None
        if not parsed:
            raise UserError(f"--define {item!r}: expected NAME=INTEGER, e.g. MKL_PREFETCH_W2_KB=0")
        out += parsed.items()
    return tuple(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidate", action="append", help=f"repeatable; one of {', '.join(FA.CANDIDATES)}")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="another request field for every candidate (e.g. tripwire=off)")
    ap.add_argument("--define", action="append", default=[], metavar="NAME=INT",
                    help="a compile-time define added to every candidate's build (a diagnostic, e.g. "
                         "MKL_PREFETCH_W2_KB=0); integers only")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--subspans", action="store_true",
                    help="build with MKL_PROF_SUBSPANS=1: also the time points inside the tasks, per layer and task")
    ap.add_argument("--out", type=Path, help="raw rings and the JSON go here")
    a = ap.parse_args()
    extra = {}
    for item in a.set:
        k, _, v = item.partition("=")
        extra[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
    defines = build_defines(a.define)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    f = FA.Faithful()
    results = []
    try:
        for name in a.candidate or ["production"]:
            cand = FA.candidate(name)
            more = (*defines, *((("MKL_PROF_SUBSPANS", 1),) if a.subspans else ()))
            if more:
                cand = dataclasses.replace(cand, defines=(*cand.defines, *more))
            label = (name + "".join(f",{k}={v}" for k, v in (*extra.items(), *defines))
                     + (",subspans" if a.subspans else ""))
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
    from hazards.engine.errors import ToolchainMissing, UserError

    try:
        sys.exit(main())
    except (UserError, ToolchainMissing, FA.DeviceError, FA.RingTooSmall) as e:  # a bad name, no GPU, no nvcc
        sys.exit(f"megakernel_layers_profile: {e}")
