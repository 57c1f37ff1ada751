"""The torch reference of the layered MoE decode megakernel's model, and its mishandlings.

`make_weights` regenerates the kernel's weights bit for bit from the hash in
`standalone/megakernel_layers/mkl_model.h` (bf16, every value exact before the bf16
rounding). `forward` is one decode step in the kernel's precision: bf16 weights and KV
cache, fp32 activations and accumulation, the new token's K/V rounded to bf16, the expert
input quantized to FP8 E4M3 with one power-of-two scale per 128 elements. It takes options
that re-create, at the level of the math, what each silent-corruption switch makes the
kernel compute (stale SwiGLU outputs, a stale attention chunk, stale routing, layer 0's W2
and KV cache, a garbage tail scale, bf16 input read as fp32): the calibration's D rows.
`forward(..., accumulate=torch.float64, chunk_tokens=n)` is the independent implementation
(fp64 accumulation, chunked flash-decoding merge) that measures the floor E.
More in docs/megakernel-layers.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from hazards.ragged_decode.reference import rel_err  # noqa: F401  (the one relative error)
from hazards.megakernel_layers import model as M

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return ((x * lo) + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on an int64 tensor of 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform_pm(key: int, n: int, scale: float, device: Any = "cpu") -> torch.Tensor:
    """Elements 0..n-1 of a hashed tensor: fp32 in [-scale, scale), as the kernel makes them."""
    idx = torch.arange(n, dtype=torch.int64, device=device)
    h = hash32(_mul32(idx, 0x9E3779B9) ^ key)
    u = (h >> 8).to(torch.float32) * (1.0 / 16777216.0)
    return (u - 0.5) * (2.0 * scale)


@dataclasses.dataclass
class Weights:
    """Every tensor of the model, per layer (lists), plus the input."""

    shape: M.Shape
    seq: int
    attn_norm: list[torch.Tensor]
    mlp_norm: list[torch.Tensor]
    wqkv: list[torch.Tensor]          # (qkv_rows, D) bf16
    wo: list[torch.Tensor]            # (D, NQ*HD)
    router: list[torch.Tensor]        # (E, D)
    w13: list[torch.Tensor]           # (E, 2I, D): rows 2c gate, 2c+1 up
    w2: list[torch.Tensor]            # (E, D, I)
    kcache: list[torch.Tensor]        # (seq, NKV, HD) bf16: the context
    vcache: list[torch.Tensor]
    x0: torch.Tensor                  # (D,) fp32

    @property
    def layers(self) -> int:
        return len(self.wqkv)


def make_weights(shape: M.Shape, layers: int, seq: int, seed: int = 1, device: Any = "cpu") -> Weights:
    """The kernel's weights, KV cache and input for (shape, layers, seq, data_seed)."""
    s = shape
    key = lambda kind, l, e=0: M.tensor_key(seed, kind, l, e)  # noqa: E731

    def bf(kind: int, l: int, shp: tuple[int, ...], scale: float, e: int = 0) -> torch.Tensor:
        n = 1
        for d in shp:
            n *= d
        return uniform_pm(key(kind, l, e), n, scale, device).to(torch.bfloat16).view(shp)

    w = Weights(s, seq, [], [], [], [], [], [], [], [], [],
                uniform_pm(key(M.T_INPUT, 0), s.D, M.SCALE_INPUT, device))
    for l in range(layers):
        w.attn_norm.append(1.0 + uniform_pm(key(M.T_ATTN_NORM, l), s.D, M.SCALE_NORM, device))
        w.mlp_norm.append(1.0 + uniform_pm(key(M.T_MLP_NORM, l), s.D, M.SCALE_NORM, device))
        w.wqkv.append(bf(M.T_WQKV, l, (M.qkv_rows(s), s.D), M.SCALE_W))
        w.wo.append(bf(M.T_WO, l, (s.D, s.NQ * M.HD), M.SCALE_W))
        w.router.append(bf(M.T_ROUTER, l, (s.E, s.D), M.SCALE_W))
        w.w13.append(torch.stack([bf(M.T_W13, l, (2 * s.I, s.D), M.SCALE_W, e) for e in range(s.E)]))
        w.w2.append(torch.stack([bf(M.T_W2, l, (s.D, s.I), M.SCALE_W, e) for e in range(s.E)]))
        w.kcache.append(bf(M.T_KCACHE, l, (seq, s.NKV, M.HD), M.SCALE_KCACHE))
        w.vcache.append(bf(M.T_VCACHE, l, (seq, s.NKV, M.HD), M.SCALE_VCACHE))
    return w


def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean() + M.RMS_EPS) * w


def fp8_roundtrip(x: torch.Tensor, *, zero_tail_block: bool = False) -> torch.Tensor:
    """E4M3 round trip along the last dimension (each row its own blocks), one power-of-two
    scale per 128 elements (the last block may be short): scale = the smallest 2^e with
    amax / 2^e <= 448. `zero_tail_block` flushes a short last block to zero: what a scale
    derived from a huge garbage amax does to it (amax_tail)."""
    n = x.shape[-1]
    pad = (-n) % M.FP8_BLOCK
    xb = F.pad(x.float(), (0, pad)).reshape(*x.shape[:-1], -1, M.FP8_BLOCK)
    amax = xb.abs().amax(dim=-1)
    mant, ex = torch.frexp(amax / M.FP8_MAX)
    ex = torch.where(mant == 0.5, ex - 1, ex)
    scale = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), ex), torch.ones_like(amax))
    q = (xb / scale[..., None]).to(torch.float8_e4m3fn).to(torch.float32) * scale[..., None]
    if zero_tail_block and pad:
        q[..., -1, :] = 0.0
    return q.reshape(*x.shape[:-1], -1)[..., :n]


def _matvec(w: torch.Tensor, x: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    return (w.to(acc) @ x.to(acc)).to(torch.float32)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, acc: torch.dtype = torch.float32,
              chunk_tokens: int = 0, stale: dict[int, tuple] | None = None) -> tuple[torch.Tensor, list]:
    """Decode attention: q (NQ, HD) fp32, k/v (S, NKV, HD) bf16 -> (NQ*HD,), and the chunk
    partials [(m, l, acc)] when `chunk_tokens` > 0 (flash-decoding: each chunk alone, then
    the LSE merge). `stale` maps chunk index -> partial to use instead (a stale merge input)."""
    nq, nkv = q.shape[0], k.shape[1]
    kk = k.to(acc).repeat_interleave(nq // nkv, dim=1)  # (S, NQ, HD)
    vv = v.to(acc).repeat_interleave(nq // nkv, dim=1)
    qq = q.to(acc)
    if chunk_tokens <= 0:
        sc = torch.einsum("nd,snd->ns", qq, kk) * 0.125
        p = torch.softmax(sc, dim=1)
        return torch.einsum("ns,snd->nd", p, vv).to(torch.float32).reshape(-1), []
    parts = []
    S = k.shape[0]
    chunks = M.auto_chunks(S, chunk_tokens, 1 << 30)
    for c in range(chunks):
        a, e = M.chunk_begin(c, chunks, S), M.chunk_begin(c + 1, chunks, S)
        if stale and c in stale:
            parts.append(stale[c])
            continue
        sc = torch.einsum("nd,snd->ns", qq, kk[a:e]) * 0.125
        m = sc.amax(dim=1)
        p = torch.exp(sc - m[:, None])
        parts.append((m, p.sum(dim=1), torch.einsum("ns,snd->nd", p, vv[a:e])))
    mx = torch.stack([m for m, _, _ in parts]).amax(dim=0)
    num = sum(a * torch.exp(m - mx)[:, None] for m, _, a in parts)
    den = sum(l * torch.exp(m - mx) for m, l, _ in parts)
    return (num / den[:, None]).to(torch.float32).reshape(-1), parts


@dataclasses.dataclass(frozen=True)
class Mishandling:
    """What a silent-corruption switch makes the kernel compute, at the level of the math."""

    stale_swiglu: bool = False       # stale_release: W2 reads the previous layer's SwiGLU outputs
    stale_chunk: bool = False        # partial_no_fence: chunk 0 merged from the previous layer
    stale_routing: bool = False      # routing_no_fence: experts, weights and input of the previous layer
    layer0_w2_kv: bool = False       # stale_descriptor: W2 and KV cache of layer 0 in every layer
    zero_tail_block: bool = False    # amax_tail: the short last FP8 block flushed by a garbage scale
    bf16_input_as_fp32: bool = False  # dead_flag: the input packed as bf16, read as fp32


MISHANDLINGS = {
    "stale_release": Mishandling(stale_swiglu=True),
    "partial_no_fence": Mishandling(stale_chunk=True),
    "routing_no_fence": Mishandling(stale_routing=True),
    "stale_descriptor": Mishandling(layer0_w2_kv=True),
    "amax_tail": Mishandling(zero_tail_block=True),
    "dead_flag": Mishandling(bf16_input_as_fp32=True),
}


def bf16_pairs_as_fp32(x: torch.Tensor) -> torch.Tensor:
    """The dead flag's input: x packed as bf16 into a zeroed fp32 buffer, read as fp32."""
    n = x.numel()
    raw = torch.zeros(2 * n, dtype=torch.int16, device=x.device)
    raw[:n] = x.to(torch.bfloat16).view(torch.int16)
    return raw.view(torch.float32).clone()


def forward(w: Weights, *, acc: torch.dtype = torch.float32, chunk_tokens: int = 0,
            bad: Mishandling = Mishandling(), trace: dict | None = None) -> torch.Tensor:
    """One decode step through every layer; returns the final hidden state (D,) fp32.

    `trace`, if given, receives per-layer routing ids (to compare with the kernel's)."""
    s = w.shape
    x = bf16_pairs_as_fp32(w.x0) if bad.bf16_input_as_fp32 else w.x0.float()
    prev: dict[str, Any] = {}
    nq, nk = s.NQ * M.HD, s.NKV * M.HD
    for l in range(w.layers):
        kv_layer = 0 if bad.layer0_w2_kv else l
        xn = rmsnorm(x, w.attn_norm[l])
        qkv = _matvec(w.wqkv[l], xn, acc)
        q = qkv[:nq].view(s.NQ, M.HD)
        k = torch.cat([w.kcache[kv_layer], qkv[nq:nq + nk].to(torch.bfloat16).view(1, s.NKV, M.HD)])
        v = torch.cat([w.vcache[kv_layer], qkv[nq + nk:].to(torch.bfloat16).view(1, s.NKV, M.HD)])
        stale = {0: prev["parts"][0]} if bad.stale_chunk and l > 0 and prev.get("parts") else None
        ct = chunk_tokens or (128 if bad.stale_chunk else 0)
        attn, parts = attention(q, k, v, acc, ct, stale)
        h = x + _matvec(w.wo[l], attn, acc)
        hn = rmsnorm(h, w.mlp_norm[l])
        logits = _matvec(w.router[l], hn, acc)
        sel, ids = torch.topk(logits, s.K)
        wts = torch.softmax(sel, dim=0)
        route = (ids, wts, hn)
        if bad.stale_routing and l > 0:
            route = prev["route"]
        r_ids, r_wts, r_hn = route
        w2_layer = 0 if bad.layer0_w2_kv else l
        y = torch.zeros(s.D, dtype=torch.float32, device=x.device)
        sws = []
        for j in range(s.K):
            e = int(r_ids[j])
            gu = _matvec(w.w13[l][e], r_hn, acc)
            g, u = gu[0::2], gu[1::2]
            sw = g / (1.0 + torch.exp(-g)) * u
            sws.append(sw)
            if bad.stale_swiglu and l > 0:
                sw = prev["sw"][j]
            a = fp8_roundtrip(sw, zero_tail_block=bad.zero_tail_block)
            y = y + r_wts[j] * _matvec(w.w2[w2_layer][e], a, acc)
        x = h + y
        prev = {"parts": parts, "route": route, "sw": sws}
        if trace is not None:
            trace.setdefault("ids", []).append([int(i) for i in ids])
    return x


# ---- the fast-torch baselines (performance only) --------------------------------------


def step_bf16(w: Weights, kv: dict[str, torch.Tensor], *, host_routing: bool = False,
              fixed_ids: list[list[int]] | None = None, trace: list | None = None) -> torch.Tensor:
    """The same decode step the way plain torch runs it fast: bf16 activations, cuBLAS GEMVs,
    SDPA with GQA over a (NKV, S, HD) cache whose last row receives the new token.

    The experts of a layer are chosen one of three ways:
    host_routing: the eager style (expert ids read on the host, one F.linear per selected
    expert on its weights in place); fixed_ids: the same in-place F.linear on the experts
    given per layer (ids read once before a graph capture: the minimal-byte graph, a lower
    bound for torch since the routing is frozen at capture, not a serving path); neither:
    capturable with live routing (the selected experts' weights gathered with index_select,
    then batched GEMVs: ~2.5x the minimal bytes). The combine weights always come from the
    router computed in the step. `trace` receives each layer's selected ids (as tensors)."""
    s = w.shape
    nq, nk = s.NQ * M.HD, s.NKV * M.HD
    x = w.x0.to(torch.bfloat16)
    for l in range(w.layers):
        xn = F.rms_norm(x, (s.D,), w.attn_norm[l].to(torch.bfloat16), eps=M.RMS_EPS)
        qkv = F.linear(xn, w.wqkv[l])
        kv["k"][l][:, -1] = qkv[nq:nq + nk].view(s.NKV, M.HD)
        kv["v"][l][:, -1] = qkv[nq + nk:].view(s.NKV, M.HD)
        o = F.scaled_dot_product_attention(qkv[:nq].view(1, s.NQ, 1, M.HD), kv["k"][l][None], kv["v"][l][None],
                                           enable_gqa=True)
        h = x + F.linear(o.reshape(-1), w.wo[l])
        hn = F.rms_norm(h, (s.D,), w.mlp_norm[l].to(torch.bfloat16), eps=M.RMS_EPS)
        sel, ids = torch.topk(F.linear(hn, w.router[l]).float(), s.K)
        wts = torch.softmax(sel, dim=0).to(torch.bfloat16)
        if trace is not None:
            trace.append(ids)
        if host_routing or fixed_ids is not None:
            experts = ids.tolist() if host_routing else fixed_ids[l]
            y = torch.zeros_like(x)
            for j, e in enumerate(experts):
                gu = F.linear(hn, w.w13[l][e])
                y = y + wts[j] * F.linear(F.silu(gu[0::2]) * gu[1::2], w.w2[l][e])
        else:
            w13 = w.w13[l].index_select(0, ids)          # (K, 2I, D)
            w2 = w.w2[l].index_select(0, ids)            # (K, D, I)
            gu = torch.bmm(w13, hn.expand(s.K, s.D)[:, :, None])[:, :, 0]
            a = F.silu(gu[:, 0::2]) * gu[:, 1::2]
            y = (torch.bmm(w2, a[:, :, None])[:, :, 0] * wts[:, None]).sum(0)
        x = h + y
    return x


def host_ids(w: Weights, kv: dict[str, torch.Tensor]) -> list[list[int]]:
    """Each layer's selected experts of one eager step (what a fixed-routing capture freezes)."""
    trace: list = []
    step_bf16(w, kv, host_routing=True, trace=trace)
    return [t.tolist() for t in trace]


def bf16_cache(w: Weights) -> dict[str, list[torch.Tensor]]:
    """The KV cache as (NKV, S, HD) per layer with a slot for the new token (SDPA's layout)."""
    def per_layer(c: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat([t, t[-1:]]).transpose(0, 1).contiguous() for t in c]
    return {"k": per_layer(w.kcache), "v": per_layer(w.vcache)}
