"""A small GPT-OSS-shaped MoE transformer and the numeric "paths" it can run through.

The architecture is the layered megakernel's (a small GPT-OSS-shaped MoE): per layer RMSNorm, a QKV
projection (grouped-query heads, rotary positions), causal attention, an O projection,
then RMSNorm, a router picking the top-k of E experts, SwiGLU experts (W13 then W2);
a final RMSNorm and an untied LM head whose vocabulary is padded (the pad columns exist
in the logits and must be sliced out of every softmax). More in docs/gates.md.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F

ACCUM_STEPS = 23
PERTURBED_GEMMS = ("qkv", "w13", "w2")  # the MI355 megakernel PR's PIPELINED_QKV / W13 / W2 loops


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int = 96          # real tokens
    vocab_padded: int = 128  # LM head columns (the pad is sliced out of the softmax)
    d_model: int = 128
    layers: int = 2
    n_q: int = 4
    n_kv: int = 2
    head_dim: int = 32
    experts: int = 4
    top_k: int = 2
    d_ff: int = 256
    context: int = 128
    rope_base: float = 10000.0
    rope: bool = True  # False: positions only through causality (the layered megakernel has no RoPE)


TINY = ModelConfig(vocab=24, vocab_padded=32, d_model=32, layers=1, n_q=2, n_kv=1, head_dim=16, experts=2,
                   top_k=1, d_ff=64, context=32)
# The layered megakernel's architecture at toy size, runnable by its binary as compiled
# (hazards/gates/synthlm/megakernel.py): heads of 64 in the 16 q / 4 kv grouping its attention
# is instantiated for, no RoPE (the kernel has none), an expert intermediate of 33 FP8
# sub-blocks of 32 (more than one round of 32 lanes and not a multiple of 4, so the amax
# butterfly has a tail, as at GPT-OSS-20B's 2880).
LAYERS = ModelConfig(d_model=128, layers=2, n_q=16, n_kv=4, head_dim=64, experts=4, top_k=2, d_ff=1056, rope=False)


@dataclasses.dataclass(frozen=True)
class Path:
    """How a forward pass does its arithmetic (docs/gates.md, In the code)."""

    name: str
    gemm: str = "torch"
    perturb: float = 0.0
    weights: str = "f32"
    declared: str | None = None
    sink: str = "f32"

    @property
    def declared_weights(self) -> str:
        return self.declared or self.weights


PATHS: dict[str, Path] = {p.name: p for p in (
    Path("reference"),
    Path("reference_mxfp4", weights="mxfp4"),
    Path("clean", gemm="steps23"),
    Path("accum23", gemm="steps23", perturb=1.0 / 64),
    Path("bf16_logits", gemm="steps23", sink="bf16"),
    Path("quant_candidate_only", gemm="steps23", weights="mxfp4", declared="f32"),
    Path("quantized", gemm="steps23", weights="mxfp4"),
    Path("sink_striped", gemm="steps23", sink="striped"),
)}

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def mxfp4_roundtrip(w: torch.Tensor, block: int = 32) -> torch.Tensor:
    """w rounded to E2M1 values with one power-of-two scale per `block` along the last dim."""
    rows, k = w.shape
    pad = (-k) % block
    x = F.pad(w, (0, pad)).reshape(rows, -1, block)
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))
    grid = torch.tensor(E2M1, dtype=w.dtype, device=w.device)
    mag = (x.abs() / scale).unsqueeze(-1)
    q = grid[(mag - grid).abs().argmin(dim=-1)] * torch.sign(x) * scale
    return q.reshape(rows, -1)[:, :k].contiguous()


def init_params(cfg: ModelConfig, seed: int = 0, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Fresh f32 parameters (scaled normal init)."""
    g = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(device)

    d, hd = cfg.d_model, cfg.head_dim
    p: dict[str, torch.Tensor] = {"embed": normal(cfg.vocab_padded, d, std=0.02),
                                  "norm_f": torch.ones(d, device=device),
                                  "lm_head": normal(cfg.vocab_padded, d, std=1 / math.sqrt(d))}
    for i in range(cfg.layers):
        p[f"{i}.norm1"] = torch.ones(d, device=device)
        p[f"{i}.qkv"] = normal((cfg.n_q + 2 * cfg.n_kv) * hd, d, std=1 / math.sqrt(d))
        p[f"{i}.o"] = normal(d, cfg.n_q * hd, std=1 / math.sqrt(cfg.n_q * hd) / math.sqrt(2 * cfg.layers))
        p[f"{i}.norm2"] = torch.ones(d, device=device)
        p[f"{i}.router"] = normal(cfg.experts, d, std=1 / math.sqrt(d))
        for e in range(cfg.experts):
            p[f"{i}.{e}.w13"] = normal(2 * cfg.d_ff, d, std=1 / math.sqrt(d))
            p[f"{i}.{e}.w2"] = normal(d, cfg.d_ff, std=1 / math.sqrt(cfg.d_ff) / math.sqrt(2 * cfg.layers))
    return p


QUANTIZED = ("qkv", "o", "w13", "w2", "lm_head")


def path_weights(params: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """The weights as `path` uses them (mxfp4 round-trip of QKV, O, experts, LM head)."""
    if path.weights == "f32":
        return params
    if path.weights != "mxfp4":
        raise ValueError(f"unknown weight format {path.weights!r}")
    return {k: (mxfp4_roundtrip(v) if k.rsplit(".", 1)[-1] in QUANTIZED else v) for k, v in params.items()}


class Gemm:
    """The path's matrix multiply; counts calls so the perturbed step is reproducible."""

    def __init__(self, path: Path, seed: int = 0) -> None:
        self.path, self.calls, self.seed = path, 0, seed

    def __call__(self, x: torch.Tensor, w: torch.Tensor, kind: str) -> torch.Tensor:
        self.calls += 1
        if self.path.gemm == "torch":
            return x @ w.t()
        if self.path.gemm != "steps23":
            raise ValueError(f"unknown gemm {self.path.gemm!r}")
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        k = x2.shape[1]
        bounds = torch.linspace(0, k, ACCUM_STEPS + 1).round().long().tolist()
        acc = torch.zeros(x2.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
        victim, rows = -1, None
        if self.path.perturb > 0 and kind in PERTURBED_GEMMS:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
            same = [j for j in range(ACCUM_STEPS - 1)
                    if bounds[j + 1] - bounds[j] == bounds[j + 2] - bounds[j + 1] > 0]
            victim = same[int(torch.randint(len(same), (1,), generator=g))]
            hit = torch.rand(x2.shape[0], generator=g) < self.path.perturb
            rows = hit.to(x.device)
        for j in range(ACCUM_STEPS):
            a, b = bounds[j], bounds[j + 1]
            if a == b:
                continue
            part = x2[:, a:b] @ w[:, a:b].t()
            if j == victim:  # the next iteration's operand landed before this MFMA read it
                stale = x2[:, a:b] @ w[:, b:b + (b - a)].t()
                part = torch.where(rows[:, None], stale, part)
            acc = acc + part
        return acc.reshape(*shape[:-1], w.shape[0])


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary positions on (B, H, T, hd)."""
    t, hd = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    ang = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def forward(params: dict[str, torch.Tensor], tokens: torch.Tensor, cfg: ModelConfig,
            gemm: Any = None) -> torch.Tensor:
    """f32 logits (B, T, vocab_padded) of a causal forward pass (teacher forcing)."""
    gemm = gemm or (lambda x, w, kind: x @ w.t())
    bsz, t = tokens.shape
    hd, nq, nkv = cfg.head_dim, cfg.n_q, cfg.n_kv
    h = params["embed"][tokens]
    for i in range(cfg.layers):
        x = rms_norm(h, params[f"{i}.norm1"])
        qkv = gemm(x, params[f"{i}.qkv"], "qkv")
        q, k, v = qkv.split((nq * hd, nkv * hd, nkv * hd), dim=-1)
        q = q.view(bsz, t, nq, hd).transpose(1, 2)
        k = k.view(bsz, t, nkv, hd).transpose(1, 2)
        if cfg.rope:
            q, k = rope(q, cfg.rope_base), rope(k, cfg.rope_base)
        v = v.view(bsz, t, nkv, hd).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + gemm(att.transpose(1, 2).reshape(bsz, t, nq * hd), params[f"{i}.o"], "o")
        x = rms_norm(h, params[f"{i}.norm2"])
        router = x @ params[f"{i}.router"].t()
        top, idx = router.topk(cfg.top_k, dim=-1)
        gates = torch.zeros_like(router).scatter(-1, idx, torch.softmax(top, dim=-1))
        moe = torch.zeros_like(h)
        for e in range(cfg.experts):
            up = gemm(x, params[f"{i}.{e}.w13"], "w13")
            a, b = up.chunk(2, dim=-1)
            moe = moe + gates[..., e:e + 1] * gemm(F.silu(a) * b, params[f"{i}.{e}.w2"], "w2")
        h = h + moe
    return gemm(rms_norm(h, params["norm_f"]), params["lm_head"], "lm_head")


def run_path(params: dict[str, torch.Tensor], tokens: torch.Tensor, cfg: ModelConfig, path: Path,
             batch: int = 64, seed: int = 0) -> dict[str, Any]:
    """Teacher-forced logits of `tokens` (N, T+1) through `path`: the sink the gate reads
    (f32 array of (N, T, vocab_padded)), the path's own greedy tokens, the targets."""
    weights = path_weights(params, path)
    gemm = Gemm(path, seed)
    sinks, emitted = [], []
    with torch.no_grad():
        for s in range(0, tokens.shape[0], batch):
            chunk = tokens[s:s + batch]
            logits = forward(weights, chunk[:, :-1], cfg, gemm).float()
            emitted.append(logits[..., :cfg.vocab].argmax(-1).cpu())
            if path.sink == "f32":
                sink = logits
            elif path.sink == "bf16":
                sink = logits.to(torch.bfloat16).float()
            elif path.sink == "striped":  # columns written by the wrong block: 16-wide stripes rotated
                sink = torch.roll(logits.reshape(*logits.shape[:-1], -1, 16), 1, dims=-2).reshape(logits.shape)
            else:
                raise ValueError(f"unknown sink {path.sink!r}")
            sinks.append(sink.cpu())
    return {"logits": torch.cat(sinks).numpy(), "emitted": torch.cat(emitted).numpy(),
            "targets": tokens[:, 1:].cpu().numpy(), "vocab_size": cfg.vocab,
            "weight_format": path.declared_weights, "path": path.name}


def gemm_rel_error(path: Path, m: int = 256, k: int = 256, n: int = 256, seed: int = 0) -> float:
    """Relative Frobenius error of one `kind="w13"` GEMM of `path` against x @ W^T (float64)."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    ref = (x.double() @ w.double().t())
    got = Gemm(path, seed)(x, w, "w13").double()
    return float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))
