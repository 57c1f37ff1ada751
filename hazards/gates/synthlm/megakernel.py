"""The logit gate on the real layered megakernel: its binary decodes the trained synthetic-language model.

The model (`synthlm.model.LAYERS`) is the kernel's architecture at toy size, run by the
family's own build: the embedding and the LM head run in torch around the kernel, every
decoder layer in the binary's `--decode` mode (one launch per token, teacher-forced); each
family variant's logit sink is judged by `hazards gate logits` against the precision-matched
torch reference (`--out DIR [--variants clean,amax_tail] [--defines MKL_CAMPAIGN_STEP=4]`).
docs/gates.md ("The logit gate on the layered megakernel") has the model, the weight loader,
the reference, the limits, the variants and the exit codes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from hazards.engine.errors import EXIT_BAD_INPUT, EXIT_HAZARD, EXIT_NOT_JUDGED, EXIT_OK, UserError
from hazards.gates import LOGIT_DEFAULT_MAX_KL, LOGIT_DEFAULT_RATIO

CONFIG = "layers"
WEIGHT_FORMAT = "bf16 weights, bf16 kv, fp8-e4m3 expert input"
# The attention head groupings (q heads, kv heads) the kernel instantiates (mkl_decode.cuh's
# attention_compiled states the same for the binary).
COMPILED_HEADS = ((64, 8), (16, 4))
# Variants of the family table the decode runs, and the verdict each must get.
VARIANTS: tuple[tuple[str, str], ...] = (
    ("clean", "pass"), ("clean_skew", "pass"), ("stale_descriptor", "fail"), ("amax_tail", "fail"),
    ("dead_flag", "fail"), ("stale_release", "fail"))
DECODE_FIELDS = ("hazard", "jitter_ppm", "jitter_cycles", "writeback_ppm", "gemv_depth", "tripwire")
# The gate's own default limits (calibrated on the small model). On this model, trained 150
# and 279 steps on a CPU, a correct reordering (f64 accumulation) sat at 3e-11 and 1.6e-12
# nats of KL and the mildest corruption modelled in torch (amax_tail as a zeroed last FP8
# block in every expert input) at 4.2e-5 and 8.4e-5, so the defaults keep the floor and the
# corruption far apart (docs/gates.md).
RATIO = LOGIT_DEFAULT_RATIO
MAX_KL = LOGIT_DEFAULT_MAX_KL
CEILING_MARGIN_NATS = 0.5
TRAIN_SECONDS = 35.0  # the training cap (part of the weights' cache key): ci/gpu/layers-logit-gate.sh's too


def kernel_shape(cfg: Any) -> Any:
    """The kernel's Shape for a synthlm ModelConfig; UserError naming what the kernel cannot run."""
    from hazards.megakernel_layers import model as M

    why = []
    if cfg.head_dim != M.HD:
        why.append(f"head_dim {cfg.head_dim} (the kernel's is {M.HD})")
    if (cfg.n_q, cfg.n_kv) not in COMPILED_HEADS:
        why.append(f"{cfg.n_q} q / {cfg.n_kv} kv heads (compiled: "
                   + ", ".join(f"{q} / {k}" for q, k in COMPILED_HEADS) + ")")
    if cfg.rope:
        why.append("RoPE (the kernel has none)")
    if cfg.d_model % 8:
        why.append(f"d_model {cfg.d_model} not a multiple of 8")
    if cfg.d_ff % M.SUB_BLOCK:
        why.append(f"d_ff {cfg.d_ff} not a multiple of {M.SUB_BLOCK}")
    if not (1 <= cfg.top_k <= min(16, cfg.experts) and cfg.experts <= 64):
        why.append(f"{cfg.experts} experts top-{cfg.top_k} (at most 64 experts, top-k <= 16)")
    if why:
        raise UserError("the layered megakernel cannot run this model: " + "; ".join(why))
    return M.Shape(cfg.d_model, cfg.n_q, cfg.n_kv, cfg.experts, cfg.top_k, cfg.d_ff)


def kernel_weights(params: dict[str, Any], cfg: Any) -> Any:
    """The weight loader: the model's decoder layers in the kernel's layout and precision
    (hazards.megakernel_layers.reference.Weights, no KV cache, no input)."""
    import torch

    from hazards.megakernel_layers import model as M
    from hazards.megakernel_layers.reference import Weights

    s = kernel_shape(cfg)
    expect = {"qkv": (M.qkv_rows(s), s.D), "o": (s.D, s.NQ * M.HD), "router": (s.E, s.D)}
    dev = params["embed"].device
    w = Weights(s, 0, [], [], [], [], [], [], [], [], [], torch.zeros(s.D, device=dev))
    bf = torch.bfloat16
    for i in range(cfg.layers):
        for name, shp in expect.items():
            if tuple(params[f"{i}.{name}"].shape) != shp:
                raise UserError(f"weight {i}.{name} has shape {tuple(params[f'{i}.{name}'].shape)}, "
                                f"the kernel's layout needs {shp}")
        w.attn_norm.append(params[f"{i}.norm1"].float().contiguous())
        w.mlp_norm.append(params[f"{i}.norm2"].float().contiguous())
        w.wqkv.append(params[f"{i}.qkv"].to(bf).contiguous())  # rows: q heads, k heads, v heads
        w.wo.append(params[f"{i}.o"].to(bf).contiguous())
        w.router.append(params[f"{i}.router"].to(bf).contiguous())
        w13 = []
        for e in range(s.E):
            m = params[f"{i}.{e}.w13"]  # rows [0, I) gate, [I, 2I) up (the model's chunk(2))
            if tuple(m.shape) != (2 * s.I, s.D):
                raise UserError(f"weight {i}.{e}.w13 has shape {tuple(m.shape)}, the kernel's layout needs "
                                f"{(2 * s.I, s.D)}")
            w13.append(torch.stack((m[:s.I], m[s.I:]), dim=1).reshape(2 * s.I, s.D))  # 2c gate, 2c + 1 up
        w.w13.append(torch.stack(w13).to(bf).contiguous())
        w.w2.append(torch.stack([params[f"{i}.{e}.w2"] for e in range(s.E)]).to(bf).contiguous())
        empty = torch.zeros(0, s.NKV, M.HD, dtype=bf, device=dev)
        w.kcache.append(empty)
        w.vcache.append(empty)
    return w


def _layer_tensors(w: Any, layer: int) -> list[Any]:
    """One layer's tensors in the file's order (mkl_decode.cuh)."""
    return [w.attn_norm[layer], w.mlp_norm[layer], w.wqkv[layer], w.wo[layer], w.router[layer], w.w13[layer],
            w.w2[layer]]


def pack(w: Any) -> bytes:
    """The weights file `--decode` reads: per layer attn_norm f32, mlp_norm f32, Wqkv, Wo,
    router, W13, W2 bf16, packed without gaps."""
    import torch

    out = bytearray()
    for layer in range(w.layers):
        for t in _layer_tensors(w, layer):
            out += t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return bytes(out)


def unpack(blob: bytes, shape: Any, layers: int) -> Any:
    """`pack`'s inverse (ValueError when the size does not match the shape)."""
    import torch

    from hazards.megakernel_layers import model as M
    from hazards.megakernel_layers.reference import Weights

    s = shape
    sizes = [((s.D,), torch.float32), ((s.D,), torch.float32), ((M.qkv_rows(s), s.D), torch.bfloat16),
             ((s.D, s.NQ * M.HD), torch.bfloat16), ((s.E, s.D), torch.bfloat16),
             ((s.E, 2 * s.I, s.D), torch.bfloat16), ((s.E, s.D, s.I), torch.bfloat16)]
    per = sum(math.prod(shp) * (4 if dt == torch.float32 else 2) for shp, dt in sizes)
    if len(blob) != per * layers:
        raise ValueError(f"weights file of {len(blob)} bytes; {layers} layers of this shape need {per * layers}")
    raw = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    w = Weights(s, 0, [], [], [], [], [], [], [], [], [], torch.zeros(s.D))
    off = 0
    for _ in range(layers):
        got = []
        for shp, dt in sizes:
            n = math.prod(shp) * (4 if dt == torch.float32 else 2)
            got.append(raw[off:off + n].view(dt).reshape(shp).clone())
            off += n
        for lst, t in zip((w.attn_norm, w.mlp_norm, w.wqkv, w.wo, w.router, w.w13, w.w2), got):
            lst.append(t)
        empty = torch.zeros(0, s.NKV, M.HD, dtype=torch.bfloat16)
        w.kcache.append(empty)
        w.vcache.append(empty)
    return w


def reference_hidden(w: Any, x: Any, *, acc: Any = None, batch: int = 32, kernel_rounding: bool = True,
                     trace: dict[str, list] | None = None) -> Any:
    """The precision-matched reference: the residual stream after the last layer for inputs
    x (N, T, D) f32, each sequence decoded token by token in the kernel's arithmetic
    (teacher-forced, so computed for all positions at once with a causal mask). `acc`
    (torch.float64) accumulates every GEMV and the attention in f64: a correct kernel's
    different rounding, the gate's floor. `kernel_rounding=False` leaves K/V and the expert
    input unrounded: the model's own f32 forward on these weights (the layout check).
    `trace` receives each layer's bf16 K and V rows (N, T, NKV, HD) of the first batch."""
    import torch

    from hazards.gates.synthlm.model import rms_norm
    from hazards.megakernel_layers import model as M
    from hazards.megakernel_layers.reference import fp8_roundtrip

    acc = acc or torch.float32
    s = w.shape
    nq, nk, gq = s.NQ * M.HD, s.NKV * M.HD, s.NQ // s.NKV

    def mm(a: Any, b: Any) -> Any:  # a (..., K) @ b (N, K)^T, accumulated in `acc`, f32 out
        return (a.to(acc) @ b.to(acc).t()).float()

    outs = []
    for b0 in range(0, x.shape[0], batch):
        h = x[b0:b0 + batch].float()
        n, t, _ = h.shape
        causal = torch.ones(t, t, dtype=torch.bool, device=h.device).tril()
        for layer in range(w.layers):
            qkv = mm(rms_norm(h, w.attn_norm[layer]), w.wqkv[layer])
            q = qkv[..., :nq].view(n, t, s.NQ, M.HD)
            cache = torch.bfloat16 if kernel_rounding else torch.float32  # the kernel's cache is bf16
            k = qkv[..., nq:nq + nk].to(cache).view(n, t, s.NKV, M.HD)
            v = qkv[..., nq + nk:].to(cache).view(n, t, s.NKV, M.HD)
            if trace is not None and b0 == 0:
                trace.setdefault("k", []).append(k)
                trace.setdefault("v", []).append(v)
            k = k.repeat_interleave(gq, dim=2).to(acc)  # q head j reads kv head j // gq
            v = v.repeat_interleave(gq, dim=2).to(acc)
            sc = torch.einsum("bqhd,bkhd->bhqk", q.to(acc), k) * 0.125
            p = torch.softmax(sc.masked_fill(~causal, float("-inf")), dim=-1)
            att = torch.einsum("bhqk,bkhd->bqhd", p, v).float().reshape(n, t, nq)
            h = h + mm(att, w.wo[layer])
            hn = rms_norm(h, w.mlp_norm[layer])
            top, ids = mm(hn, w.router[layer]).topk(s.K, dim=-1)
            gates = torch.softmax(top, dim=-1)
            y = torch.zeros_like(h)
            for e in range(s.E):
                gu = mm(hn, w.w13[layer][e])
                g, u = gu[..., 0::2], gu[..., 1::2]
                a = g / (1.0 + torch.exp(-g)) * u
                a = fp8_roundtrip(a) if kernel_rounding else a
                ye = mm(a, w.w2[layer][e])
                wt = (gates * (ids == e)).sum(-1, keepdim=True)  # 0 where e is not selected
                y = y + wt * ye
            h = h + y
        outs.append(h)
    return torch.cat(outs)


def lm_head(params: dict[str, Any], hidden: Any) -> Any:
    """Final RMSNorm and the untied LM head in torch, f32: the same for every path."""
    from hazards.gates.synthlm.model import rms_norm

    return rms_norm(hidden.float(), params["norm_f"].float()) @ params["lm_head"].float().t()


def sink(params: dict[str, Any], hidden: Any, targets: Any, cfg: Any, name: str) -> dict[str, Any]:
    """The logit sink of one path (hazards.gates.logits.save's dict): f32 logits from the
    path's hidden states, its own greedy tokens from the same f32 logits."""
    import torch

    with torch.no_grad():
        logits = lm_head(params, hidden)
    return {"logits": logits.cpu().numpy(), "emitted": logits[..., :cfg.vocab].argmax(-1).cpu().numpy(),
            "targets": targets, "vocab_size": cfg.vocab, "weight_format": WEIGHT_FORMAT, "path": name}


def family_variants() -> dict[str, dict[str, Any]]:
    """The family table's variants, reduced to the fields the decode takes."""
    from hazards.family import read_table
    from hazards.kernel_sources import family_dir

    table = read_table(family_dir("megakernel_layers") / "family.toml")
    return {v.name: {k: v.params[k] for k in DECODE_FIELDS if k in v.params} for v in table["variants"]}


def decode_request(shape: Any, layers: int, sequences: int, positions: int, fields: dict[str, Any],
                   files: dict[str, str], grid: int = 0, chunks: int = 8, seed: int = 1) -> dict[str, Any]:
    """The JSON request of `--decode` (mkl_decode.cuh)."""
    return {**files, "shape": [shape.D, shape.NQ, shape.NKV, shape.E, shape.K, shape.I], "layers": layers,
            "sequences": sequences, "positions": positions, "grid": grid, "chunks": chunks, "seed": seed, **fields}


def run_decode(binary: Path, w: Any, x: Any, fields: dict[str, Any], *, grid: int = 0, chunks: int = 8,
               timeout: float = 120.0, workdir: Path | None = None) -> tuple[Any, dict[str, Any]]:
    """The megakernel's residual stream after the last layer for inputs x (N, T, D): the
    binary's `--decode` run once over every sequence. (hidden (N, T, D) f32 tensor on x's
    device, the binary's MKL_DECODE object). RuntimeError naming the cause on any failure."""
    import numpy as np
    import torch

    n, t, d = x.shape
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        files = {"weights": f"{tmp}/weights.bin", "inputs": f"{tmp}/inputs.bin", "out": f"{tmp}/out.bin"}
        Path(files["weights"]).write_bytes(pack(w))
        x.detach().float().cpu().numpy().astype(np.float32).tofile(files["inputs"])
        req = decode_request(w.shape, w.layers, n, t, fields, files, grid, chunks)
        try:
            proc = subprocess.run([str(binary), "--decode", json.dumps(req)], capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"--decode {fields} did not finish in {timeout:.0f} s (a hang?)") from None
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("MKL_DECODE ")]
        try:
            reply = json.loads(lines[-1][len("MKL_DECODE "):]) if lines else {}
        except ValueError:
            raise RuntimeError(f"--decode {fields}: exit {proc.returncode}: a malformed reply line "
                               f"{lines[-1][:200]!r}") from None
        if not isinstance(reply, dict):
            reply = {"message": f"a reply that is not an object: {lines[-1][:200]!r}"}
        if proc.returncode != 0 or reply.get("status") != "ok":
            raise RuntimeError(f"--decode {fields}: exit {proc.returncode}: "
                               f"{reply.get('message') or proc.stderr.strip()[-400:] or 'no MKL_DECODE line'}")
        out = np.fromfile(files["out"], dtype=np.float32) if Path(files["out"]).is_file() else np.zeros(0)
        if out.size != n * t * d:
            raise RuntimeError(f"--decode {fields}: the output file holds {out.size} floats, not {n * t * d} "
                               f"({n} x {t} x {d})")
        out = out.reshape(n, t, d)
    return torch.from_numpy(out).to(x.device), reply


def run(out: Path, *, device: str | None = None, max_seconds: float | None = TRAIN_SECONDS, sequences: int | None = 64,
        variants: Sequence[str] | None = None, defines: dict[str, int] | None = None, grid: int = 0, chunks: int = 8,
        ratio: float = RATIO, max_kl: float = MAX_KL, ceiling_nats: float = CEILING_MARGIN_NATS, timeout: float = 120.0,
        log: Any = None) -> dict[str, Any]:
    """Train/load the model, build the binary, write every path's sink, judge each variant
    (the perplexity ceiling: exp(the exact floor + `ceiling_nats`))."""
    import torch

    from hazards.family import build_harness
    from hazards.gates import logits as lg
    from hazards.gates.synthlm import harness, language, train

    log = log or (lambda s: None)
    names = list(variants or [v for v, _ in VARIANTS])
    expected = dict(VARIANTS)
    table = family_variants()
    unknown = [v for v in names if v not in table]
    if unknown:
        raise UserError(f"unknown variant(s) {', '.join(unknown)} (the family's: {', '.join(table)})")
    cfg = train.CONFIGS[CONFIG]
    kernel_shape(cfg)  # refuse a model the kernel cannot run before training it
    t0 = time.monotonic()
    binary = build_harness("megakernel_layers", defines=defines)  # in the cache after the first build
    build_s = time.monotonic() - t0
    params, summary = train.load_or_train(CONFIG, device, max_seconds, log=log)
    device = summary["device"] if device is None else device
    params = {k: v.to(device) for k, v in params.items()}
    tc = train.TrainConfig()
    toks = train.eval_tokens(cfg, tc)[:sequences]
    floor = float(language.bayes_nll(train.language_for(cfg, tc), toks)[:, 1:].mean())
    ceiling = math.exp(floor + ceiling_nats)
    targets = toks[:, 1:]
    tokens = torch.from_numpy(toks).to(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out.mkdir(parents=True, exist_ok=True)
    w = kernel_weights(params, cfg)
    with torch.no_grad():
        x = params["embed"][tokens[:, :-1]].float()  # the embedding, in torch
        sets: dict[str, Any] = {}
        seconds: dict[str, float] = {}
        for name, a in (("reference", None), ("reference_f64", torch.float64)):
            t1 = time.monotonic()
            data = sink(params, reference_hidden(w, x, acc=a), targets, cfg, name)
            seconds[name] = round(time.monotonic() - t1, 2)
            lg.save(out / f"{name}.npz", data)
            sets[name] = lg.load(out / f"{name}.npz")
        decodes = {}
        errors: dict[str, str] = {}
        for name in names:
            t1 = time.monotonic()
            try:  # one variant that could not be decoded or read (a hang, a fault, non-finite
                # logits) is that variant's `error`, never a verdict; the others are still judged
                hidden, reply = run_decode(binary, w, x, table[name], grid=grid, chunks=chunks, timeout=timeout)
                decodes[name] = reply
                log(f"{name}: {reply.get('launches')} launches, {reply.get('us_per_launch', 0):.1f} us each")
                lg.save(out / f"{name}.npz", sink(params, hidden, targets, cfg, name))
                sets[name] = lg.load(out / f"{name}.npz")
            except (RuntimeError, UserError) as exc:
                errors[name] = str(exc)
                log(f"{name}: not judged: {exc}")
            seconds[name] = round(time.monotonic() - t1, 2)
    rows = []
    for name in ["reference_f64", *names]:
        want = "pass" if name == "reference_f64" else expected.get(name, "fail")
        if name in errors:
            rows.append({"variant": name, "expected": want, "got": "error", "ok": False, "failed": ["error"],
                         "error": errors[name], "fixed_prefix": None, "sink": None, "params": table.get(name, {})})
            continue
        res = lg.judge(sets["reference"], sets[name], ceiling=ceiling, ratio=ratio, max_kl=max_kl)
        res.update(variant=name, expected=want, got=res["verdict"], ok=res["verdict"] == want,
                   decode=decodes.get(name), params=table.get(name, {}))
        rows.append(res)
    fixed = {r["variant"]: r["fixed_prefix"] for r in rows if r["fixed_prefix"] is not None}
    correct = [v for v in fixed if v == "reference_f64" or expected.get(v) == "pass"]
    known_bad = [v for v in fixed if v not in correct]
    form = harness.calibration_form(fixed, correct, known_bad, ratio, max_kl) if known_bad and correct else []
    return {"config": CONFIG, "model": dataclasses.asdict(cfg), "calibration": form,
            "training": summary, "floor_nats": floor, "ceiling": ceiling, "ratio": ratio, "max_kl": max_kl,
            "sequences": int(toks.shape[0]), "positions": int(targets.size), "binary": str(binary),
            "defines": defines or {}, "build_seconds": round(build_s, 1), "path_seconds": seconds, "rows": rows,
            "files": str(out)}


def table(result: dict[str, Any]) -> str:
    """The markdown table of variants."""
    lines = ["| variant | expected | got | ppl ratio | mean KL | argmax agreement | top-1 ref / cand | "
             "us/launch | failed gates |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        f = r["fixed_prefix"]
        if f is None:
            lines.append(f"| {r['variant']} | {r['expected']} | error | {r['error'][:160]} | | | | | error |")
            continue
        us = (r.get("decode") or {}).get("us_per_launch")
        lines.append(f"| {r['variant']} | {r['expected']} | {r['got']} | {f['ppl_ratio']:.6f} | {f['kl_mean']:.3g} | "
                     f"{f['argmax_agreement']:.4f} | {f['top1_ref']:.4f} / {f['top1_cand']:.4f} | "
                     f"{'-' if us is None else f'{us:.1f}'} | {', '.join(r['failed']) or '-'} |")
    return "\n".join(lines)


def parse_defines(text: str | None) -> dict[str, int] | None:
    """`NAME=INT,NAME=INT` -> dict (UserError on anything else)."""
    if not text:
        return None
    out = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name.strip().isidentifier():
            raise UserError(f"bad define {item!r}: NAME=INT")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise UserError(f"bad define {item!r}: the value must be an integer") from None
    return out


def main(argv: list[str] | None = None) -> int:
    from hazards.gates.synthlm import harness

    ap = argparse.ArgumentParser(prog="python3 -m hazards.gates.synthlm.megakernel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the .npz sinks and result.json")
    ap.add_argument("--variants", default=None, help="comma list of the family's variants (default: "
                    + ",".join(v for v, _ in VARIANTS) + ")")
    ap.add_argument("--sequences", type=int, default=64, help="held-out sequences decoded (128 tokens each)")
    ap.add_argument("--defines", default=None, help="a candidate build: NAME=INT,... (e.g. MKL_CAMPAIGN_STEP=3)")
    ap.add_argument("--grid", type=int, default=0, help="persistent workers (0: one per SM)")
    ap.add_argument("--chunks", type=int, default=8, help="attention chunks, fixed for the run")
    ap.add_argument("--max-seconds", type=float, default=TRAIN_SECONDS, help="training time limit (if not cached)")
    ap.add_argument("--ratio", type=float, default=RATIO)
    ap.add_argument("--max-kl", type=float, default=MAX_KL)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per decode run")
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    try:
        if args.sequences < 1:
            raise UserError("--sequences must be at least 1")
        # what the run would only trip on after its GPU work
        from hazards.engine.errors import check_seconds
        from hazards.gates.logits import check_limits

        check_limits(ratio=args.ratio, max_kl=args.max_kl)
        check_seconds(args.timeout, "--timeout")
        if args.grid < 0 or args.chunks < 1:
            raise UserError(f"--grid must be >= 0 and --chunks >= 1, got {args.grid} and {args.chunks}")
        import torch

        if not torch.cuda.is_available():
            print("layers logit gate: no usable GPU (the megakernel runs on one): nothing judged", file=sys.stderr)
            return EXIT_NOT_JUDGED
        variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else None
        result = run(args.out, device=args.device, max_seconds=args.max_seconds, sequences=args.sequences,
                     variants=variants, defines=parse_defines(args.defines), grid=args.grid, chunks=args.chunks,
                     ratio=args.ratio, max_kl=args.max_kl, timeout=args.timeout,
                     log=lambda s: print(s, file=sys.stderr, flush=True))
    except UserError as exc:
        print(f"layers logit gate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (RuntimeError, OSError, ValueError) as exc:  # a build, a decode or the files failed: not judged
        print(f"layers logit gate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_NOT_JUDGED
    (args.out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    t = result["training"]
    print(f"model: {t['params']} params, {t['steps']} steps in {t['train_seconds']}s on {t['device']}; held-out "
          f"loss {t['eval_loss']:.4f} nats vs exact floor {t['floor']:.4f} (gap {t['gap_nats']:.4f})")
    print(f"decoded {result['sequences']} sequences ({result['positions']} positions) per variant; limits: ratio "
          f"{result['ratio']}, max KL {result['max_kl']:g}, ceiling {result['ceiling']:.3f}")
    print(table(result))
    for line in harness.calibration_lines(result["calibration"]):
        print(line)
    for r in result["rows"]:
        print("LAYERS_LOGIT_GATE " + json.dumps({k: r[k] for k in ("variant", "expected", "got", "ok", "failed")}
                                                | {"fixed_prefix": r["fixed_prefix"], "sink": r["sink"],
                                                   "error": r.get("error")}))
    return EXIT_OK if all(r["ok"] for r in result["rows"]) else EXIT_HAZARD


if __name__ == "__main__":
    sys.exit(main())
