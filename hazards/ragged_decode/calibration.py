"""Tolerance calibration for ragged decode (the ragged-decode contract's correctness table).

Two kinds of rows, measured on the same draws (calls x seeds, fresh permutations):
  * E: the error of an independent correct implementation (fp32, 2048-token tiles,
    flash-decoding merge) against the reference -- the floor any correct kernel sits on;
  * D: the error of known-bad mishandlings of the ragged structure (every length clamped
    at 8192, one fixed length for every request, `starts` ignored, partials merged without
    rescaling) -- what the tolerance must catch.
The gate tol = 1e-2 is sound when tol/E is comfortably > 1 and every D/tol is > 1.
E is reported as the maximum over calls, each D as the minimum (the least detectable).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from hazards.ragged_decode.reference import draw_call, reference_decode, rel_err

TOL = 1e-2
Impl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (q, starts, lens) -> out


def tiled_decode_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor,
                      lens: torch.Tensor, *, tile: int = 2048, rescale: bool = True) -> torch.Tensor:
    """Independent implementation: fp32 attention per `tile` tokens, then the merge.

    With rescale=False the per-tile softmax outputs are averaged instead of merged with
    exp(m_i - m) weights: the silent, plausible-looking mis-merge the contract warns about.
    """
    B, n_q, hd = q.shape
    n_kv = k.shape[1]
    scale = hd ** -0.5
    out = torch.zeros(B, n_q, hd, dtype=torch.float32, device=q.device)
    for b, (s, n) in enumerate(zip(starts.tolist(), lens.tolist())):
        if n <= 0:
            continue
        qb = q[b].float().view(n_kv, n_q // n_kv, hd)
        ms, ls, accs = [], [], []
        for a in range(0, n, tile):
            kt = k[s + a:s + min(a + tile, n)].float()
            vt = v[s + a:s + min(a + tile, n)].float()
            sc = torch.einsum("hgd,thd->hgt", qb, kt) * scale
            m = sc.amax(-1, keepdim=True)
            p = torch.exp(sc - m)
            ms.append(m)
            ls.append(p.sum(-1, keepdim=True))
            accs.append(torch.einsum("hgt,thd->hgd", p, vt))
        if rescale:
            mx = torch.stack(ms).amax(0)
            w = [torch.exp(m - mx) for m in ms]
            o = sum(a * wi for a, wi in zip(accs, w)) / sum(l * wi for l, wi in zip(ls, w))
        else:
            o = sum(a / l for a, l in zip(accs, ls)) / len(accs)
        out[b] = o.reshape(n_q, hd)
    return out.view(B, n_q * hd)


def mishandlings(k: torch.Tensor, v: torch.Tensor, *, clamp: int = 8192,
                 tile: int = 2048) -> dict[str, Impl]:
    """The known-bad implementations, each the reference fed a mishandled structure."""
    rows = k.shape[0]

    def clamped(q, starts, lens):
        return reference_decode(q, k, v, starts, lens.clamp(max=clamp))

    def fixed_length(q, starts, lens):
        fixed = int(lens.sum()) // lens.numel()  # the mean length, for every request
        return reference_decode(q, k, v, starts, torch.clamp(rows - starts, max=fixed))

    def starts_ignored(q, starts, lens):
        return reference_decode(q, k, v, torch.zeros_like(starts), lens)

    def no_rescale(q, starts, lens):
        return tiled_decode_fp32(q, k, v, starts, lens, tile=tile, rescale=False)

    return {
        f"every length clamped at {clamp}": clamped,
        "one fixed length (the mean) for every request": fixed_length,
        "`starts` ignored (every request from row 0)": starts_ignored,
        f"{tile}-token partials averaged, no exp(m_i - m) rescale": no_rescale,
    }


@dataclass
class Row:
    """One implementation's errors against the reference over all draws."""

    name: str
    kind: str  # "independent", "mishandling" or "candidate"
    errors: list[float] = field(default_factory=list)

    @property
    def worst(self) -> float:
        """The number the table reports: max for E/candidates, min for mishandlings."""
        return min(self.errors) if self.kind == "mishandling" else max(self.errors)


@dataclass
class Calibration:
    """The table: E, each D, and any candidate implementations measured on the same draws."""

    rows: list[Row]
    tol: float
    draws: int

    @property
    def floor(self) -> float:
        """E: the independent implementation's worst error."""
        return next(r.worst for r in self.rows if r.kind == "independent")

    def sound(self) -> bool:
        """tol sits above E and below every D."""
        return self.floor < self.tol and all(r.worst > self.tol for r in self.rows if r.kind == "mishandling")

    def lines(self) -> list[tuple[str, str, str]]:
        """(implementation, rel err, ratio) rows for printing."""
        out = []
        for r in self.rows:
            if r.kind == "independent":
                ratio = f"tol/E = {self.tol / r.worst:.1f}"
            elif r.kind == "mishandling":
                ratio = f"D/tol = {r.worst / self.tol:.1f}"
            else:
                ratio = "pass" if r.worst <= self.tol else "FAIL"
            out.append((r.name, f"{r.worst:.3g}", ratio))
        return out


def calibrate(k: torch.Tensor, v: torch.Tensor, lens: Sequence[int], n_q: int, *,
              seeds: Sequence[int] = (0, 1), calls: int = 8, tol: float = TOL, clamp: int = 8192,
              tile: int = 2048, candidates: dict[str, Impl] | None = None) -> Calibration:
    """Measure E, each D and every candidate against the reference on the same draws."""
    hd = k.shape[2]
    independent = Row(f"independent: fp32, {tile}-token tiles, flash-decoding merge", "independent")
    bad = {name: Row(name, "mishandling") for name in mishandlings(k, v, clamp=clamp, tile=tile)}
    cands = {name: Row(name, "candidate") for name in (candidates or {})}
    impls = mishandlings(k, v, clamp=clamp, tile=tile)
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(calls):
            q, starts, lens_t = draw_call(lens, n_q, hd, gen, device=k.device)
            ref = reference_decode(q, k, v, starts, lens_t)
            independent.errors.append(rel_err(tiled_decode_fp32(q, k, v, starts, lens_t, tile=tile), ref))
            for name, fn in impls.items():
                bad[name].errors.append(rel_err(fn(q, starts, lens_t), ref))
            for name, fn in (candidates or {}).items():
                cands[name].errors.append(rel_err(fn(q, starts, lens_t), ref))
    return Calibration([independent, *bad.values(), *cands.values()], tol, len(seeds) * calls)
