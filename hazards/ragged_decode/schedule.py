"""A pure-Python model of the megakernel's device-side schedule (no torch, no GPU).

The kernel (standalone/megakernel/ragged_decode.cu) recomputes this every call from
`lens`: requests ranked longest-first form one "line" of tokens; chunks of the line are
handed out by an atomic counter; a chunk is cut at request boundaries into pieces, and a
piece that is not a whole request writes its partial into slot ``chunk + line_position``.
This model states the same formulas so that the invariants the kernel relies on (every
token in exactly one piece, slots unique and below capacity, the merge enumerating exactly
the pieces of its request) are tested on the CPU, and so buffers can be sized on the host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

GUIDED, SPLIT = 0, 1  # the kernel's Schedule enum


@dataclass(frozen=True)
class Piece:
    """Tokens [begin, end) of request `req` taken from chunk `chunk` (slot = chunk + line pos)."""

    chunk: int
    req: int
    line_pos: int
    begin: int
    end: int
    whole: bool

    @property
    def slot(self) -> int:
        return self.chunk + self.line_pos


def line_order(lens: Sequence[int]) -> list[int]:
    """Requests longest-first, ties by index (the kernel's rank sort)."""
    return sorted(range(len(lens)), key=lambda b: (-max(lens[b], 0), b))


def guided_start(k: int, total: int, phases: int, phase_chunks: int) -> int:
    """Line position where guided chunk k starts: phase j has chunks of weight 2^(J-1-j)."""
    if k >= phases * phase_chunks:
        return total
    j, r = divmod(k, phase_chunks)
    g = phase_chunks * ((1 << phases) - (1 << (phases - j))) + r * (1 << (phases - 1 - j))
    return total * g // (phase_chunks * ((1 << phases) - 1))


def tiles(length: int, tile: int) -> int:
    """Tiles of a request under the split schedule (tile 0: one per non-empty request)."""
    length = max(length, 0)
    return math.ceil(length / tile) if tile > 0 else int(length > 0)


def n_chunks(lens: Sequence[int], schedule: int, tile: int, phases: int, phase_chunks: int) -> int:
    """How many chunks the atomic counter hands out."""
    if schedule == GUIDED:
        return phases * phase_chunks
    return sum(tiles(n, tile) for n in lens)


def chunks(lens: Sequence[int], schedule: int, tile: int = 0, phases: int = 6,
           phase_chunks: int = 132) -> list[tuple[int, int]]:
    """Line range [a, e) of every chunk, in counter order."""
    order = line_order(lens)
    sizes = [max(lens[b], 0) for b in order]
    pref = [0]
    for n in sizes:
        pref.append(pref[-1] + n)
    if schedule == GUIDED:
        bounds = [guided_start(k, pref[-1], phases, phase_chunks) for k in range(phases * phase_chunks + 1)]
        return list(zip(bounds[:-1], bounds[1:]))
    out = []
    for pos, n in enumerate(sizes):
        for i in range(tiles(n, tile)):
            a = pref[pos] + i * tile if tile > 0 else pref[pos]
            out.append((a, min(a + tile, pref[pos + 1]) if tile > 0 else pref[pos + 1]))
    return out


def pieces(lens: Sequence[int], schedule: int, tile: int = 0, phases: int = 6,
           phase_chunks: int = 132) -> Iterator[Piece]:
    """Every piece the producer warps emit, chunk by chunk."""
    order = line_order(lens)
    pref = [0]
    for b in order:
        pref.append(pref[-1] + max(lens[b], 0))
    for k, (a, e) in enumerate(chunks(lens, schedule, tile, phases, phase_chunks)):
        while a < e:
            pos = max(i for i in range(len(order)) if pref[i] <= a)  # upper_bound - 1
            pe = min(e, pref[pos + 1])
            yield Piece(k, order[pos], pos, a - pref[pos], pe - pref[pos],
                        a == pref[pos] and pe == pref[pos + 1])
            a = pe


def slot_capacity(lens: Sequence[int], schedule: int, tile: int, phases: int, phase_chunks: int) -> int:
    """Partial slots to allocate: chunk indices plus line positions (at least 1)."""
    if schedule == SPLIT and tile == 0:
        return 1  # one block per request: every piece is whole, no partials
    return n_chunks(lens, schedule, tile, phases, phase_chunks) + len(lens)
