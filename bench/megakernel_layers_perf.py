#!/usr/bin/env python3
"""The layered MoE decode megakernel against the copy floor and torch, and the tripwire's cost.

    PYTHONPATH=$PWD python3 bench/megakernel_layers_perf.py [--layers 4 --seq 4096 --rounds 9
        --launches 20 --also gemv_depth=1 --json OUT]

One process, one GPU, one run: measures the device copy bandwidth BW (4 GiB device copy,
read + write bytes, as the ragged-decode bench does) and the floor = bytes one decode step
reads / BW; times the megakernel through the family binary's --bench mode (one launch per
step, every switch off; the graph of one step is captured to count its kernels) with the
tripwire compiled out, compiled in without a file, and compiled in writing a /dev/shm file
(rotating order per round; paired per-round ratios); times the same model in torch, eager
(expert ids read on the host) and as a CUDA graph (experts gathered on the device), and
counts their kernels per step with the profiler. Prints one table with every ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from ragged_decode_h200 import copy_bandwidth, count_launches  # noqa: E402

from hazards.engine.tripwire import TripwireFile  # noqa: E402
from hazards.families import get_family  # noqa: E402
from hazards.megakernel_layers import model as M  # noqa: E402
from hazards.megakernel_layers import reference as R  # noqa: E402
from hazards.stress_family import family_binary  # noqa: E402


def fields(items: list[str]) -> dict:
    """NAME=VALUE items as request fields (integers where they read as one)."""
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def megakernel_bench(exe: Path, params: dict, rounds: int, launches: int) -> dict:
    """The binary's paired timing (MKL_BENCH line), with a tripwire file to write into."""
    with TripwireFile() as tw:
        proc = subprocess.run([str(exe), "--bench", json.dumps({"rounds": rounds, "launches": launches,
                                                                 "params": params})],
                              capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                                 **tw.env()})
    for line in proc.stdout.splitlines():
        if line.startswith("MKL_BENCH "):
            return json.loads(line[len("MKL_BENCH "):])
    raise SystemExit(f"--bench failed (exit {proc.returncode}): {proc.stdout[-800:]}\n{proc.stderr[-800:]}")


def time_fn(fn, n: int, warmup: int = 3) -> float:
    """Median seconds per call (events around each call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    marks = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        marks.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / 1e3 for s, e in marks)


def torch_baselines(w: R.Weights, n: int) -> dict:
    """Eager (host routing) and CUDA-graph (device gather) timings and kernel counts."""
    out = {}
    kv = R.bf16_cache(w)
    eager = lambda: R.step_bf16(w, kv, host_routing=True)  # noqa: E731
    out["eager_s"] = time_fn(eager, n)
    out["eager_launches"] = count_launches(lambda *a: eager(), ())
    kvg = R.bf16_cache(w)
    gfn = lambda: R.step_bf16(w, kvg, host_routing=False)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            gfn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gfn()
    out["graph_s"] = time_fn(g.replay, n)
    out["graph_launches"] = count_launches(lambda *a: g.replay(), ())
    ref = R.forward(w)
    out["eager_rel_err"] = R.rel_err(eager().float(), ref)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--torch-calls", type=int, default=10)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="another request field for the megakernel (e.g. gemv_depth=4); repeatable")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                    help="another configuration timed in the same run, beside the first (e.g. gemv_depth=1: "
                         "round 2's GEMV loop); repeatable")
    ap.add_argument("--json", help="write every number here")
    a = ap.parse_args()
    exe = family_binary(get_family("megakernel_layers"))
    params = {"layers": a.layers, "seq": a.seq, **fields(a.set)}
    also = {spec: {**params, **fields(spec.split(","))} for spec in a.also}
    fam = get_family("megakernel_layers")
    for p in (params, *also.values()):
        fam.resolve(p)  # a bad field is one line here, not a failed bench
    res: dict = {"layers": a.layers, "seq": a.seq, "params": params, "device": torch.cuda.get_device_name()}
    res["bw"] = copy_bandwidth()
    mk = megakernel_bench(exe, params, a.rounds, a.launches)
    res["megakernel"] = mk
    res["also"] = {spec: megakernel_bench(exe, p, a.rounds, a.launches) for spec, p in also.items()}
    res["bytes_per_step"] = mk["bytes_per_step"]
    assert abs(mk["bytes_per_step"] - M.step_bytes(M.SHAPES["default"], a.layers, a.seq)) < 1.0
    res["floor_us"] = mk["bytes_per_step"] / res["bw"] * 1e6
    if not a.no_torch:
        w = R.make_weights(M.SHAPES["default"], a.layers, a.seq, 1, "cuda")
        res["torch"] = torch_baselines(w, a.torch_calls)
    floor = res["floor_us"]
    print(f"{res['device']}: {a.layers} layers, seq {a.seq}, {mk['grid']} workers, {mk['chunks']} chunks; "
          f"{mk['bytes_per_step'] / 1e6:.0f} MB per step; copy BW {res['bw'] / 1e9:.0f} GB/s; "
          f"floor {floor:.1f} us")
    rows = [("copy-bandwidth floor", floor, "-"),
            ("megakernel, tripwire compiled out", mk["us_off"], mk["kernels_per_step"]),
            ("megakernel, tripwire compiled in, no file", mk["us_on_null"], mk["kernels_per_step"])]
    if "us_on_file" in mk:
        rows.append((f"megakernel, tripwire writing ({mk.get('tripwire_mode')})", mk["us_on_file"],
                     mk["kernels_per_step"]))
    for spec, m2 in res["also"].items():
        rows += [(f"megakernel [{spec}], tripwire compiled out", m2["us_off"], m2["kernels_per_step"]),
                 (f"megakernel [{spec}], tripwire compiled in, no file", m2["us_on_null"], m2["kernels_per_step"])]
    if "torch" in res:
        t = res["torch"]
        rows += [("torch eager (bf16, host routing)", t["eager_s"] * 1e6, t["eager_launches"]["kernels"]),
                 ("torch CUDA graph (bf16, device gather)", t["graph_s"] * 1e6, t["graph_launches"]["kernels"])]
    print(f"  {'':<56} {'us/step':>9} {'x floor':>8} {'kernels/step':>13}")
    for name, us, k in rows:
        print(f"  {name:<56} {us:9.1f} {us / floor:8.2f} {str(k):>13}")
    print(f"tripwire cost (paired median of {a.rounds} rounds): compiled in, no file "
          f"{(mk['ratio_on_null_vs_off'] - 1) * 100:+.2f}%"
          + (f"; writing {(mk['ratio_on_file_vs_off'] - 1) * 100:+.2f}%" if "ratio_on_file_vs_off" in mk else ""))
    for spec, m2 in res["also"].items():
        print(f"  [{spec}]: compiled in, no file {(m2['ratio_on_null_vs_off'] - 1) * 100:+.2f}%; "
              f"this configuration / the first (tripwire compiled out, medians) {m2['us_off'] / mk['us_off']:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
