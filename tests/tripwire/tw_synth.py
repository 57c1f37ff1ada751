"""Synthetic tripwire images for analysis tests: an independent Python writer of layout 1.

Deliberately written from docs/tripwire.md, not from stress/tripwire/layout.py, so a
mistake in the decoder is not mirrored here (the C round-trip test covers the real writer).
"""
from __future__ import annotations

import struct
import time

from hazards.engine.tripwire.layout import Snapshot, decode


def _tag(gen: int) -> int:
    return (gen & 0x7FFF) | 0x8000


class Image:
    def __init__(self, workers: int, generation: int = 1, mode: int = 1) -> None:
        self.workers, self.generation, self.mode = workers, generation, mode
        self.words = [[0] * 16 for _ in range(workers)]

    def pos(self, w: int, layer: int, phase: int, tile: int = 0, gen: int | None = None) -> "Image":
        t = _tag(self.generation if gen is None else gen)
        self.words[w][0] = (t << 48) | (phase << 36) | (layer << 24) | tile
        return self

    def done(self, w: int) -> "Image":
        return self.pos(w, 0, 0xFFF)

    def wait(self, w: int, barrier: int, observed: int, expected: int, spins: int = 1024,
             layer: int = 0, phase: int = 1, state: int = 1) -> "Image":
        self.pos(w, layer, phase)
        t = _tag(self.generation)
        self.words[w][1] = (t << 48) | (state << 46) | (barrier << 32) | spins
        self.words[w][2] = (expected << 32) | observed
        return self

    def warp_bytes(self, w: int, arrive: list[int], exit_: list[int]) -> "Image":
        a = bytes(arrive) + bytes(32 - len(arrive))
        e = bytes(exit_) + bytes(32 - len(exit_))
        self.words[w][8:12] = struct.unpack("<4Q", a)
        self.words[w][12:16] = struct.unpack("<4Q", e)
        return self

    def tobytes(self) -> bytes:
        head = struct.pack("<IHHIIQIIQQQII", 0x57545A48, 1, 1, self.workers, 16, self.generation, self.mode,
                           0, 0, 1234, 0, 1024, 32)
        head += bytes(128 - len(head))
        return head + b"".join(struct.pack("<16Q", *w) for w in self.words)

    def snapshot(self, taken_at: float | None = None) -> Snapshot:
        return decode(self.tobytes(), "synthetic", time.time() if taken_at is None else taken_at)
