#!/usr/bin/env python3
"""The layered MoE decode megakernel against the copy floor and torch, and the tripwire's cost.

    PYTHONPATH=$PWD python3 bench/megakernel_layers_perf.py [--layers 4 --seq 4096 --rounds 9
        --launches 20 --also gemv_depth=1 --also-define MKL_CAMPAIGN_STEP=0 --compile-timeout 240
        --json OUT]

One process, one GPU, one run: measures the device copy bandwidth BW (4 GiB device copy,
read + write bytes, as the ragged-decode bench does) and the copy floor = bytes one decode
step reads / BW, and the read-stream bandwidth (a 4 GiB fp32 sum, bytes read) and its floor;
times the megakernel through the family binary's --bench mode (one launch per step, every
switch off; the graph of one step is captured to count its kernels) with the tripwire
compiled out, compiled in without a file, and compiled in writing a /dev/shm file (rotating
order per round; paired per-round ratios), and any other build (`--also-define`: the
campaign's earlier kernels, the tripwire's diagnostic builds MKL_TW_NO_MARKS / MKL_TW_NO_WATCH and
candidate MKL_TW_FASTPATH) or configuration (`--also`) beside it, each with its own paired
tripwire costs (compiled in without a file, writing); times the same model in
torch (kernels per step counted with the profiler):
  - eager (expert ids read on the host, F.linear on the experts in place);
  - the gather graph: a CUDA graph with live routing (selected experts copied with
    index_select, ~2.5x the minimal bytes);
  - the minimal-byte graph: a CUDA graph captured with the routing frozen at the eager step's
    ids, F.linear on each selected expert's weights in place (a lower bound for torch, not a
    serving path: the ids cannot change after capture);
  - torch.compile of the minimal-byte step: mode reduce-overhead (inductor's fusions under
    its CUDA graphs) and default+graph (mode default, its kernels captured in a CUDA graph
    here, in case reduce-overhead skips its graphs); max-autotune-no-cudagraphs pays a CPU
    launch per kernel and minutes of GEMM autotuning at M = 1, so it is not the default
    (`--compile-mode max-autotune-no-cudagraphs+graph` times it); compile time is capped by
    --compile-timeout.
Prints one table with every ratio and the headline line
`headline: step <us> us = <ratio>x copy floor; best torch <us> us (<path>)`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
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


def read_bandwidth(gib: float = 4.0, reps: int = 10) -> float:
    """Bytes/s of a large device reduction (fp32 sum), counting the bytes read."""
    n = int(gib * (1 << 30)) // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").uniform_(-1, 1)
    for _ in range(2):
        src.sum()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        src.sum()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del src
    torch.cuda.empty_cache()
    return 4 * n / statistics.median(times)


def captured(fn) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


class CompileTimeout(Exception):
    pass


def compiled_step(fn, mode: str, timeout_s: int):
    """torch.compile(fn, mode) compiled by its first calls, or CompileTimeout after timeout_s."""
    import signal

    def expired(*_):
        raise CompileTimeout(f"torch.compile (mode {mode}) did not finish within {timeout_s} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(timeout_s)
    try:
        cfn = torch.compile(fn, mode=mode, dynamic=False)
        for _ in range(3):  # reduce-overhead records its graph on a later call
            cfn()
        torch.cuda.synchronize()
        return cfn
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def torch_baselines(w: R.Weights, n: int, compile_modes: list[str], compile_timeout: int) -> dict:
    """Every torch path's median time per step, kernels per step and its error against eager."""

    out: dict = {}
    kv = R.bf16_cache(w)
    eager = lambda: R.step_bf16(w, kv, host_routing=True)  # noqa: E731
    ref_eager = eager().float()
    out["eager"] = {"s": time_fn(eager, n), "launches": count_launches(lambda *a: eager(), ()),
                    "what": "torch eager (bf16, host routing)"}
    kvg = R.bf16_cache(w)
    g = captured(lambda: R.step_bf16(w, kvg))
    out["graph_gather"] = {"s": time_fn(g.replay, n), "launches": count_launches(lambda *a: g.replay(), ()),
                           "what": "torch CUDA graph (live routing, experts gathered)"}
    ids = R.host_ids(w, R.bf16_cache(w))
    out["fixed_ids"] = ids
    kvf = R.bf16_cache(w)
    res: dict = {}
    gf = captured(lambda: res.__setitem__("x", R.step_bf16(w, kvf, fixed_ids=ids)))
    gf.replay()
    torch.cuda.synchronize()
    out["graph_fixed"] = {"s": time_fn(gf.replay, n), "launches": count_launches(lambda *a: gf.replay(), ()),
                          "what": "torch CUDA graph (routing fixed, experts in place)",
                          "max_abs_vs_eager": float((res["x"].float() - ref_eager).abs().max())}
    for mode in compile_modes:
        kvc = R.bf16_cache(w)
        t0 = time.monotonic()
        entry = {"what": f"torch.compile {mode} (routing fixed, experts in place)"}
        try:
            torch._dynamo.reset()
            graphed = mode.endswith("+graph")  # inductor's kernels captured in our own CUDA graph
            cfn = compiled_step(lambda: R.step_bf16(w, kvc, fixed_ids=ids), mode.removesuffix("+graph"),
                                compile_timeout)
            entry["compile_s"] = time.monotonic() - t0
            if graphed:
                outc: dict = {}
                gc = captured(lambda: outc.__setitem__("x", cfn()))
                run = gc.replay
                gc.replay()
                torch.cuda.synchronize()
                got = outc["x"]
            else:
                run = cfn
                got = cfn().clone()  # reduce-overhead's outputs are overwritten by the next replay
            entry["s"] = time_fn(run, n)
            entry["launches"] = count_launches(lambda *a: run(), ())
            entry["max_abs_vs_eager"] = float((got.float() - ref_eager).abs().max())
        except Exception as exc:  # noqa: BLE001 - a path that did not compile is reported, not fatal
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            entry["compile_s"] = time.monotonic() - t0
        out[f"compile_{mode}"] = entry
    out["eager_rel_err"] = R.rel_err(ref_eager, R.forward(w))
    return out


def tripwire_cost_lines(mk: dict, others: dict[str, dict], rounds: int) -> list[str]:
    """The tripwire's cost, paired per round inside each binary's --bench (MKL_BENCH: ratio_on_null_vs_off,
    ratio_on_file_vs_off): the first build's line, then one per other configuration or build with its own
    paired costs (compiled in without a file, writing) and its rows against the first's (unpaired medians of
    runs one after the other: compiled out against compiled out, compiled in against compiled in). A build
    of another define compiles both instances anew (ptxas allocates them in one module), so its compiled-out
    row need not be the first's machine code: its cost is against its own compiled-out row."""
    def costs(m: dict) -> str:
        out = f"compiled in, no file {(m['ratio_on_null_vs_off'] - 1) * 100:+.2f}%"
        if "ratio_on_file_vs_off" in m:
            out += f"; writing {(m['ratio_on_file_vs_off'] - 1) * 100:+.2f}%"
        return out

    lines = [f"tripwire cost (paired median of {rounds} rounds): {costs(mk)}"]
    for spec, m2 in others.items():
        lines.append(f"  [{spec}]: {costs(m2)}; this one / the first (medians): compiled out "
                     f"{m2['us_off'] / mk['us_off']:.3f}, compiled in, no file {m2['us_on_null'] / mk['us_on_null']:.3f}"
                     + (f", writing {m2['us_on_file'] / mk['us_on_file']:.3f}"
                        if "us_on_file" in m2 and "us_on_file" in mk else ""))
    return lines


def headline(step_us: float, floor_us: float, torch_res: dict | None) -> str:
    """The results page's headline: the step against the copy floor and the fastest torch path."""
    line = f"headline: step {step_us:.1f} us = {step_us / floor_us:.2f}x copy floor"
    paths = [(v["s"] * 1e6, v["what"]) for v in (torch_res or {}).values() if isinstance(v, dict) and "s" in v]
    if paths:
        us, what = min(paths)
        line += f"; best torch {us:.1f} us ({what})"
    return line


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
    ap.add_argument("--also-define", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                    help="another build of the kernel (compile-time defines, e.g. MKL_CAMPAIGN_STEP=0: round 3's "
                         "merge and router) timed in the same run; repeatable")
    ap.add_argument("--compile-mode", action="append", default=None,
                    help="torch.compile mode(s) to time (default: reduce-overhead and default+graph, the "
                         "default mode's kernels captured in a CUDA graph here); 'none' for no compile")
    ap.add_argument("--compile-timeout", type=int, default=240, help="seconds allowed per torch.compile")
    ap.add_argument("--compile-warmup-only", action="store_true",
                    help="only compile the torch.compile modes and exit (fills inductor's on-disk caches, e.g. in "
                         "a process started beside the builds; the timed run then compiles from them)")
    ap.add_argument("--json", help="write every number here")
    a = ap.parse_args()
    fam = get_family("megakernel_layers")
    params = {"layers": a.layers, "seq": a.seq, **fields(a.set)}
    also = {spec: {**params, **fields(spec.split(","))} for spec in a.also}
    for p in (params, *also.values()):
        fam.resolve(p)  # a bad field is one line here, not a failed bench
    defines = {spec: {k: int(v) for k, v in fields(spec.split(",")).items()} for spec in a.also_define}
    modes = [m for m in (a.compile_mode or ["reduce-overhead", "default+graph"]) if m != "none"]
    if a.compile_warmup_only:
        w = R.make_weights(M.SHAPES["default"], a.layers, a.seq, 1, "cuda")
        ids = R.host_ids(w, R.bf16_cache(w))
        for mode in modes:
            kvc = R.bf16_cache(w)
            torch._dynamo.reset()
            t0 = time.monotonic()
            compiled_step(lambda: R.step_bf16(w, kvc, fixed_ids=ids), mode.removesuffix("+graph"), a.compile_timeout)
            print(f"compiled {mode} in {time.monotonic() - t0:.0f} s", flush=True)
        return 0
    exe = family_binary(fam)
    builds = {spec: family_binary(fam, defines=d) for spec, d in defines.items()}
    res: dict = {"layers": a.layers, "seq": a.seq, "params": params, "device": torch.cuda.get_device_name()}
    res["bw"] = copy_bandwidth()
    res["read_bw"] = read_bandwidth()
    mk = megakernel_bench(exe, params, a.rounds, a.launches)
    res["megakernel"] = mk
    res["also"] = {spec: megakernel_bench(exe, p, a.rounds, a.launches) for spec, p in also.items()}
    res["also_define"] = {spec: megakernel_bench(b, params, a.rounds, a.launches) for spec, b in builds.items()}
    res["bytes_per_step"] = mk["bytes_per_step"]
    assert abs(mk["bytes_per_step"] - M.step_bytes(M.SHAPES["default"], a.layers, a.seq)) < 1.0
    res["floor_us"] = mk["bytes_per_step"] / res["bw"] * 1e6
    res["read_floor_us"] = mk["bytes_per_step"] / res["read_bw"] * 1e6
    if not a.no_torch:
        w = R.make_weights(M.SHAPES["default"], a.layers, a.seq, 1, "cuda")
        res["torch"] = torch_baselines(w, a.torch_calls, modes, a.compile_timeout)
    floor = res["floor_us"]
    print(f"{res['device']}: {a.layers} layers, seq {a.seq}, {mk['grid']} workers, {mk['chunks']} chunks; "
          f"{mk['bytes_per_step'] / 1e6:.0f} MB per step; copy BW {res['bw'] / 1e9:.0f} GB/s (floor {floor:.1f} us); "
          f"read BW {res['read_bw'] / 1e9:.0f} GB/s (floor {res['read_floor_us']:.1f} us)")
    rows = [("copy-bandwidth floor", floor, "-"), ("read-stream floor", res["read_floor_us"], "-"),
            ("megakernel, tripwire compiled out", mk["us_off"], mk["kernels_per_step"]),
            ("megakernel, tripwire compiled in, no file", mk["us_on_null"], mk["kernels_per_step"])]
    if "us_on_file" in mk:
        rows.append((f"megakernel, tripwire writing ({mk.get('tripwire_mode')})", mk["us_on_file"],
                     mk["kernels_per_step"]))
    for spec, m2 in [*res["also"].items(), *res["also_define"].items()]:
        rows += [(f"megakernel [{spec}], tripwire compiled out", m2["us_off"], m2["kernels_per_step"]),
                 (f"megakernel [{spec}], tripwire compiled in, no file", m2["us_on_null"], m2["kernels_per_step"])]
        if "us_on_file" in m2:
            rows.append((f"megakernel [{spec}], tripwire writing", m2["us_on_file"], m2["kernels_per_step"]))
    notes = []
    for key, entry in (res.get("torch") or {}).items():
        if not isinstance(entry, dict):
            continue
        if "s" in entry:
            rows.append((entry["what"], entry["s"] * 1e6, entry["launches"]["kernels"]))
        if "error" in entry:
            notes.append(f"{entry['what']}: not timed: {entry['error']}")
        if "compile_s" in entry:
            notes.append(f"{entry['what']}: compile {entry['compile_s']:.0f} s")
    print(f"  {'':<60} {'us/step':>9} {'x floor':>8} {'kernels/step':>13}")
    for name, us, k in rows:
        print(f"  {name:<60} {us:9.1f} {us / floor:8.2f} {str(k):>13}")
    for note in notes:
        print(f"  {note}")
    for line in tripwire_cost_lines(mk, {**res["also"], **res["also_define"]}, a.rounds):
        print(line)
    res["headline"] = headline(mk["us_off"], floor, res.get("torch"))
    print(res["headline"])
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
