"""Ragged decode attention on one GPU: the megakernel against the floor and torch, side by side.

    PYTHONPATH=$PWD python3 bench/ragged_decode_h200.py [--out-md docs/results/ragged-decode-h200.md]

One process, one GPU (written for the H200): measures the device copy bandwidth BW and the
floor 3.24 GB / BW; times the megakernel (guided schedule; the split and one-block-per-
request schedules of the same kernel), torch's eager per-request loop and torch's varlen
FlashAttention, each over fresh permutations of the contract's length multiset; counts
kernel launches per call with the profiler (and a CUDA graph for the megakernel); checks
every implementation against the reference over 8 calls x 2 seeds beside the tolerance
calibration table; prints the tables and writes them as markdown.
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hazards.ragged_decode import schedule as sched  # noqa: E402
from hazards.ragged_decode.calibration import calibrate  # noqa: E402
from hazards.ragged_decode.kernel import build_sched, graph_node_counts, ragged_decode  # noqa: E402
from hazards.ragged_decode.reference import CONTRACT_CFG, draw_call, make_arena, reference_decode, rel_err  # noqa: E402

CFG = CONTRACT_CFG
BYTES = sum(CFG["lens"]) * CFG["n_kv"] * CFG["hd"] * 2 * 2  # K and V, bf16, read once


def copy_bandwidth(gib: float = 4.0, reps: int = 10) -> float:
    """Bytes/s of a large device-to-device copy, counting bytes read plus bytes written."""
    n = int(gib * (1 << 30))
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / statistics.median(times)


def time_calls(fn, draws, n: int, warmup: int = 3) -> tuple[float, float]:
    """(median, min) seconds per call over n calls, each on the next fresh draw."""
    for i in range(warmup):
        fn(*draws[i % len(draws)])
    torch.cuda.synchronize()
    marks = []
    for i in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*draws[(warmup + i) % len(draws)])
        e.record()
        marks.append((s, e))
    torch.cuda.synchronize()
    ts = [s.elapsed_time(e) / 1e3 for s, e in marks]
    return statistics.median(ts), min(ts)


def count_launches(fn, draw) -> dict:
    """Kernels, copies and the dominant kernel's share of kernel time in one call (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn(*draw)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*draw)
        torch.cuda.synchronize()
    kernels, copies = {}, 0
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if ev.name.startswith(("Memcpy", "Memset")):
            copies += 1
            continue
        n, t = kernels.get(ev.name, (0, 0.0))
        kernels[ev.name] = (n + 1, t + ev.time_range.elapsed_us())
    total = sum(t for _, t in kernels.values()) or float("nan")
    dominant = max(kernels.items(), key=lambda kv: kv[1][1]) if kernels else ("-", (0, 0.0))
    return {"kernels": sum(n for n, _ in kernels.values()), "copies": copies,
            "dominant": dominant[0][:60], "dominant_share": dominant[1][1] / total}


def graph_kernel_count(handle, draw) -> int | None:
    """Kernel nodes in a CUDA graph captured around one megakernel call (None if unsupported)."""
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return None
    out = torch.empty(len(CFG["lens"]), CFG["n_q"] * CFG["hd"], device="cuda")
    with torch.cuda.graph(g):
        ragged_decode(handle, *draw, out=out)
    return graph_node_counts(handle, g)[0]


def varlen_flash(k, v, draw) -> tuple[object | None, str]:
    """torch's varlen FlashAttention over the arena, or None and the reason it is unusable."""
    max_k = max(CFG["lens"])
    tried = []

    def with_seqused(fn_call):
        def f(q, starts, lens):
            cu_q = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
            cu_k = torch.cat([starts, (starts[-1:] + lens[-1:])])  # per-request starts; lengths from seqused
            return fn_call(q, cu_q, cu_k, lens).reshape(q.shape[0], -1)
        return f

    def with_permuted_arena(fn_call):
        def f(q, starts, lens):
            order = torch.argsort(starts)  # arena segments are back to back: sort makes cu_k
            cu_q = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
            cu_k = torch.cat([starts.new_zeros(1), torch.cumsum(lens[order], 0, dtype=torch.int32)])
            o = fn_call(q[order].contiguous(), cu_q, cu_k, None).reshape(q.shape[0], -1)
            return torch.empty_like(o).index_copy_(0, order, o)
        return f

    cands = []
    try:
        from torch.nn.attention.varlen import varlen_attn
        params = inspect.signature(varlen_attn).parameters
        extra = {"enable_gqa": True} if "enable_gqa" in params else {}

        def va(q, cu_q, cu_k, used):
            kw = dict(extra, seqused_k=used) if used is not None else extra
            return varlen_attn(q, k, v, cu_q, cu_k, 1, max_k, **kw)
        if "seqused_k" in params:
            cands.append(("torch.nn.attention.varlen.varlen_attn (seqused_k)", with_seqused(va)))
        else:
            tried.append("varlen_attn in this torch has no seqused_k parameter, so the arena is permuted "
                         "(argsort of starts) to make cu_seq_k monotone")
        cands.append(("torch.nn.attention.varlen.varlen_attn (arena permuted)", with_permuted_arena(va)))
    except ImportError as exc:
        tried.append(f"torch.nn.attention.varlen: {exc}")
    fa = torch.ops.aten._flash_attention_forward

    def af(q, cu_q, cu_k, used):
        kw = {"seqused_k": used} if used is not None else {}
        return fa(q, k, v, cu_q, cu_k, 1, max_k, 0.0, False, False, **kw)[0]
    cands.append(("aten._flash_attention_forward (seqused_k)", with_seqused(af)))
    cands.append(("aten._flash_attention_forward (arena permuted)", with_permuted_arena(af)))
    ref = reference_decode(draw[0], k, v, draw[1], draw[2])
    for label, fn in cands:
        try:
            err = rel_err(fn(*draw), ref)
        except Exception as exc:  # noqa: BLE001 - we report why each path is unusable
            tried.append(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        if err <= 1e-2:
            fn.label = label
            return fn, "; ".join(tried)
        tried.append(f"{label}: wrong result (rel err {err:.3g})")
    return None, "; ".join(tried)


def markdown(res: dict) -> str:
    lines = ["# Ragged decode attention on the H200 (the ragged-decode contract)", "",
             f"Measured {res['date']} on {res['device']} ({res['sms']} SMs), torch {res['torch']}, "
             f"CUDA {res['cuda']}, driver {res['driver']}.", "",
             f"Command: `{res['command']}`", "",
             f"Workload: 128 requests, lengths {{65536x2, 32768x4, 16384x8, 8192x16, 4096x32, 2048x66}}, "
             f"32 query / 8 KV heads, hd 128, bf16; a fresh permutation of starts/lens (on the device) every "
             f"call; {res['bytes'] / 1e9:.3f} GB of K/V read per call.", "",
             f"Copy bandwidth BW (4 GiB device copy, read + write bytes): **{res['bw'] / 1e9:.0f} GB/s**; "
             f"floor = {res['bytes'] / 1e9:.2f} GB / BW = **{res['floor_us']:.0f} us**.", "",
             "| implementation | us/call (median) | min | GB/s | x floor | kernels/call | copies/call | "
             "dominant share | max rel err |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if r.get("us") is None:
            lines.append(f"| {r['name']} | not run: {r['note']} | | | | | | | |")
            continue
        lines.append(f"| {r['name']} | {r['us']:.0f} | {r['us_min']:.0f} | {r['gbs']:.0f} | {r['x_floor']:.3f} | "
                     f"{r['kernels']} | {r['copies']} | {r['dominant_share']:.3f} | {r['err']} |")
    lines += ["", f"Megakernel launches per call in a captured CUDA graph: {res['graph_kernels']}.",
              f"Default (split) schedule: {res['split']}.",
              f"Guided schedule (sweep): {res['guided']}.", ""]
    if res.get("sweep"):
        lines += ["Sweep (same kernel, same draws; probes skip half the work and are diagnostics only):", ""]
        lines += [f"- {x}" for x in res["sweep"]] + [""]
    if res.get("varlen_note"):
        lines += [f"varlen FlashAttention paths tried: {res['varlen_note']}", ""]
    lines += [f"## Tolerance calibration ({res['cal_draws']} draws: 8 calls x 2 seeds, fresh permutations)", "",
              "| implementation | rel err vs reference | ratio |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in res["calibration"]]
    lines += ["", "E is the maximum over draws; each D and each candidate's error is reported as the "
              "minimum (D) or maximum (candidates) over the same draws. tol = 1e-2.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-md", default="docs/results/ragged-decode-h200.md")
    ap.add_argument("--json", default=None)
    ap.add_argument("--calls", type=int, default=40, help="timed calls per implementation")
    ap.add_argument("--sweep", action="store_true", help="also time other schedule parameters")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip()
    res = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "cuda": torch.version.cuda, "driver": smi or "?", "host": platform.node(),
           "command": "PYTHONPATH=$PWD python3 bench/ragged_decode_h200.py " + " ".join(sys.argv[1:]),
           "bytes": BYTES}
    res["bw"] = copy_bandwidth()
    res["floor_us"] = BYTES / res["bw"] * 1e6
    print(f"copy bandwidth {res['bw'] / 1e9:.0f} GB/s; floor {res['floor_us']:.0f} us", flush=True)

    k, v = make_arena(CFG["lens"], CFG["n_kv"], CFG["hd"], device="cuda", seed=0)
    gen = torch.Generator().manual_seed(1234)
    draws = [draw_call(CFG["lens"], CFG["n_q"], CFG["hd"], gen, device="cuda") for _ in range(16)]
    handles = {name: build_sched({}, {"k": k, "v": v}, CFG, 1, schedule=name) for name in ("split", "per_request")}
    h = build_sched({}, {"k": k, "v": v}, CFG, 1, schedule="guided")
    ps = list(sched.pieces(CFG["lens"], sched.GUIDED, 0, h.phases, h.phase_chunks))
    part = sum(1 for p in ps if not p.whole)
    res["guided"] = (f"{h.phases} phases x {h.phase_chunks} chunks on a grid of {h.grid} blocks; {len(ps)} pieces, "
                     f"{part} partials = {part * CFG['n_q'] * (CFG['hd'] + 2) * 4 / 1e6:.1f} MB written and re-read")
    hs = handles["split"]
    ps = list(sched.pieces(CFG["lens"], sched.SPLIT, hs.tile, hs.phases, hs.phase_chunks))
    part = sum(1 for p in ps if not p.whole)
    res["split"] = (f"{hs.tile}-token tiles, {len(ps)} tiles on a grid of {hs.grid} blocks, {part} partials = "
                    f"{part * CFG['n_q'] * (CFG['hd'] + 2) * 4 / 1e6:.1f} MB written and re-read")

    impls = {"megakernel (this kernel: split schedule, 2048-token tiles)":
                 lambda q, s, l: ragged_decode(handles["split"], q, s, l),
             "megakernel, one block per request (same kernel)":
                 lambda q, s, l: ragged_decode(handles["per_request"], q, s, l),
             "torch eager per-request loop (the reference)": lambda q, s, l: reference_decode(q, k, v, s, l)}
    fa, note = varlen_flash(k, v, draws[0])
    res["varlen_note"] = note
    fa_name = f"torch varlen FlashAttention: {fa.label}" if fa else "torch varlen FlashAttention"
    if fa:
        impls[fa_name] = fa

    res["rows"] = []
    for name, fn in impls.items():
        n = args.calls if name.startswith("megakernel (") else 10
        med, mn = time_calls(fn, draws, n)
        launches = count_launches(fn, draws[0])
        res["rows"].append({"name": name, "us": med * 1e6, "us_min": mn * 1e6, "gbs": BYTES / med / 1e9,
                            "x_floor": med * 1e6 / res["floor_us"], **launches})
        print(f"{name}: {med * 1e6:.0f} us, {BYTES / med / 1e9:.0f} GB/s, x floor {med * 1e6 / res['floor_us']:.3f}, "
              f"{launches}", flush=True)
    if not fa:
        res["rows"].append({"name": fa_name, "us": None, "note": note})
    res["graph_kernels"] = graph_kernel_count(handles["split"], draws[0])
    res["sweep"] = []
    sweep = [dict(schedule="guided", phases=ph) for ph in (4, 6, 8)] + \
        [dict(schedule="split", split_tokens=t) for t in (1024, 4096)] + \
        [dict(copies="rows"), dict(probe="stream_only"), dict(probe="stream_only", copies="rows"),
         dict(probe="compute_only"), dict(probe="stream_only", grid=1), dict(probe="stream_only", copies="rows", grid=1),
         dict(probe="compute_only", grid=1)]
    for kw in (sweep if args.sweep else []):
        hs = build_sched({}, {"k": k, "v": v}, CFG, 1, **kw)
        n = 3 if kw.get("grid") == 1 else args.calls
        med, _ = time_calls(lambda q, s, l: ragged_decode(hs, q, s, l), draws, n, warmup=1 if n == 3 else 3)
        label = ", ".join(f"{a}={b}" for a, b in kw.items())
        res["sweep"].append(f"{label}: {med * 1e6:.0f} us = {BYTES / med / 1e9:.0f} GB/s "
                            f"({med * 1e6 / res['floor_us']:.3f} x floor)")
        print("sweep:", res["sweep"][-1], flush=True)

    cands = {name: fn for name, fn in impls.items() if not name.startswith("torch eager")}
    cal = calibrate(k, v, CFG["lens"], CFG["n_q"], seeds=(0, 1), calls=8, candidates=cands)
    res["cal_draws"] = cal.draws
    res["calibration"] = cal.lines()
    worst = {r.name: r.worst for r in cal.rows}
    for r in res["rows"]:
        r["err"] = f"{worst[r['name']]:.2e}" if r["name"] in worst else "(is the reference)"

    text = markdown(res)
    print("\n" + text)
    Path(args.out_md).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_md).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    ok = cal.sound() and all(r.worst <= cal.tol for r in cal.rows if r.kind == "candidate")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
