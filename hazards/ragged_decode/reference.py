"""The torch reference for ragged decode (the contract's per-request loop) and its fixtures.

`reference_decode` is the ragged-decode contract's `/app/reference.py` computation: one
host-driven attention per request over that request's own slice of the flat arena.
`make_arena` and `draw_call` build the fixture the contract describes: one contiguous bf16
arena holding a fixed multiset of segments, and per call a fresh random assignment of
segments to requests (`starts`, `lens`) plus fresh queries.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

CONTRACT_LENS = [65536] * 2 + [32768] * 4 + [16384] * 8 + [8192] * 16 + [4096] * 32 + [2048] * 66
CONTRACT_CFG = dict(n_q=32, n_kv=8, hd=128, lens=CONTRACT_LENS, wdtype="bf16")


def reference_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor,
                     lens: torch.Tensor) -> torch.Tensor:
    """softmax(q[b] K_b^T / sqrt(hd)) V_b per request, K_b = k[starts[b]:starts[b]+lens[b]].

    Returns (B, n_q*hd) head-major in q's dtype; a request with no tokens gives zeros
    (the kernel's convention).
    """
    B, n_q, hd = q.shape
    out = q.new_zeros(B, n_q * hd)
    for b, (s, n) in enumerate(zip(starts.tolist(), lens.tolist())):
        if n <= 0:
            continue
        kb = k[s:s + n].transpose(0, 1)  # (n_kv, n, hd)
        vb = v[s:s + n].transpose(0, 1)
        o = F.scaled_dot_product_attention(q[b].unsqueeze(1), kb, vb, enable_gqa=True)
        out[b] = o.reshape(-1)
    return out


def rel_err_tensor(out: torch.Tensor, ref: torch.Tensor, ref_norm: torch.Tensor | None = None) -> torch.Tensor:
    """||out - ref|| / ||ref|| in fp32 as a 0-d tensor on their device (no synchronisation);
    NaN or inf when out has NaN/inf. `ref_norm`: ||ref||, when the caller keeps it."""
    r = ref.float()
    return torch.linalg.vector_norm(out.float() - r) / (torch.linalg.vector_norm(r) if ref_norm is None else ref_norm)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp32 over the whole output (inf if out has NaN/inf)."""
    err = float(rel_err_tensor(out, ref))
    return err if math.isfinite(err) else math.inf


def segment_starts(lens: Sequence[int]) -> list[int]:
    """Arena offset of each segment when the segments are laid out back to back."""
    starts, pos = [], 0
    for n in lens:
        starts.append(pos)
        pos += n
    return starts


def make_arena(lens: Sequence[int], n_kv: int, hd: int, *, device: str | torch.device = "cpu",
               seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K and V arenas of sum(lens) rows, (T, n_kv, hd), made on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (sum(lens), n_kv, hd)
    k = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    v = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    return k, v


def draw_call(lens: Sequence[int], n_q: int, hd: int, gen: torch.Generator, *,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh (q, starts, lens) for one call: request b gets segment perm[b] of the arena.

    `gen` is a CPU generator (so draws are the same on every device).
    """
    seg = torch.tensor(segment_starts(lens), dtype=torch.int32)
    seg_lens = torch.tensor(list(lens), dtype=torch.int32)
    perm = torch.randperm(len(lens), generator=gen)
    q = torch.randn((len(lens), n_q, hd), generator=gen, dtype=torch.float32).to(torch.bfloat16)
    return q.to(device), seg[perm].contiguous().to(device), seg_lens[perm].contiguous().to(device)
