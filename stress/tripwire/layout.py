"""Decoding the tripwire file (layout 1 of `standalone/include/hz_tripwire.h`).

The file is little-endian: a 128-byte header, then one 128-byte slot (16 u64 words) per
worker. `docs/tripwire.md` is the contract; the constants here mirror the C header, and
tests/tripwire round-trips bytes written by that header's own store functions.
"""
from __future__ import annotations

import dataclasses
import os
import struct
import time
from pathlib import Path
from typing import Any

MAGIC = 0x57545A48
VERSION = 1
LAYOUT = 1
HEADER_BYTES = 128
SLOT_WORDS = 16
MAX_WARPS = 32

W_POS, W_BAR, W_OBS_EXP, W_AUX, N_AUX, W_ARRIVE, W_EXIT = 0, 1, 2, 3, 3, 8, 12

PHASE_START = 0x000
PHASE_DONE = 0xFFF

BAR_NONE, BAR_WAITING, BAR_PASSED = 0, 1, 2
BAR_STATES = {BAR_NONE: "none", BAR_WAITING: "waiting", BAR_PASSED: "passed"}

MODES = {0: "none", 1: "registered", 2: "snapshot", 3: "host-only"}

_HEADER = struct.Struct("<IHHIIQIIQQQII")  # through max_warps (64 bytes)


def tag_of(generation: int) -> int:
    """The 16-bit tag a launch of `generation` stamps on its words (never 0)."""
    return (generation & 0x7FFF) | 0x8000


@dataclasses.dataclass
class Header:
    magic: int
    version: int
    layout: int
    workers: int
    slot_words: int
    generation: int
    mode: int
    flags: int
    snapshots: int
    pid: int
    launch_ns: int
    spin_stride: int
    max_warps: int

    @property
    def mode_name(self) -> str:
        return MODES.get(self.mode, f"unknown({self.mode})")

    @property
    def valid(self) -> bool:
        return self.magic == MAGIC and self.version == VERSION and self.layout == LAYOUT


@dataclasses.dataclass
class Slot:
    """One worker's words, decoded. `current` says the position word carries this launch's tag."""

    worker: int
    raw: tuple[int, ...]
    current: bool
    written: bool  # any tagged word at all (possibly from an older launch)
    phase: int
    layer: int
    tile: int
    bar_current: bool
    bar_state: int
    barrier: int
    spins: int
    observed: int
    expected: int
    aux: tuple[int, ...]
    arrive: tuple[int, ...]
    exit: tuple[int, ...]

    @property
    def started(self) -> bool:
        return self.current

    @property
    def done(self) -> bool:
        return self.current and self.phase == PHASE_DONE

    @property
    def waiting(self) -> bool:
        return self.current and self.bar_current and self.bar_state == BAR_WAITING and not self.done

    def warp_masks(self) -> dict[int, dict[str, int]]:
        """Per point id: bit k set when warp k stored that point in the arrival/exit array."""
        out: dict[int, dict[str, int]] = {}
        for name, arr in (("arrive", self.arrive), ("exit", self.exit)):
            for k, p in enumerate(arr):
                if p:
                    out.setdefault(p, {"arrive": 0, "exit": 0})[name] |= 1 << k
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker, "current": self.current, "written": self.written,
            "phase": self.phase, "layer": self.layer, "tile": self.tile,
            "bar_current": self.bar_current, "bar_state": BAR_STATES.get(self.bar_state, str(self.bar_state)),
            "barrier": self.barrier, "spins": self.spins, "observed": self.observed,
            "expected": self.expected, "aux": [hex(a) for a in self.aux],
            "warp_masks": {str(p): {k: hex(v) for k, v in m.items()} for p, m in self.warp_masks().items()},
        }


@dataclasses.dataclass
class Snapshot:
    """One read of the file: `problem` is set (and header/slots may be empty) when it is not a tripwire."""

    path: str
    taken_at: float
    size: int
    header: Header | None
    slots: list[Slot]
    problem: str | None = None

    def with_generation(self, generation: int) -> "Snapshot":
        """The same words decoded against another launch's tag (an older, still-running one)."""
        if self.header is None:
            return self
        tag = tag_of(generation)
        slots = [decode_slot(s.worker, s.raw, tag, self.header.max_warps) for s in self.slots]
        return dataclasses.replace(self, slots=slots)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path, "taken_at": self.taken_at, "size": self.size, "problem": self.problem,
            "header": dataclasses.asdict(self.header) | {"mode_name": self.header.mode_name} if self.header else None,
            "slots": [s.to_json() for s in self.slots if s.written],
        }


def decode_slot(worker: int, words: tuple[int, ...], tag: int, max_warps: int) -> Slot:
    """Decode one slot's 16 words against the current launch's tag."""
    pos, bar, obs_exp = words[W_POS], words[W_BAR], words[W_OBS_EXP]
    masks = b"".join(w.to_bytes(8, "little") for w in words[W_ARRIVE:W_ARRIVE + 8])
    warps = min(max_warps, MAX_WARPS)
    return Slot(
        worker=worker, raw=words,
        current=(pos >> 48) == tag, written=bool(pos >> 63) or bool(bar >> 63),
        phase=(pos >> 36) & 0xFFF, layer=(pos >> 24) & 0xFFF, tile=pos & 0xFFFFFF,
        bar_current=(bar >> 48) == tag, bar_state=(bar >> 46) & 3, barrier=(bar >> 32) & 0x3FFF,
        spins=bar & 0xFFFFFFFF, observed=obs_exp & 0xFFFFFFFF, expected=obs_exp >> 32,
        aux=tuple(words[W_AUX:W_AUX + N_AUX]),
        arrive=tuple(masks[:warps]), exit=tuple(masks[32:32 + warps]),
    )


def decode(data: bytes, path: str = "", taken_at: float | None = None) -> Snapshot:
    """Decode a whole file image. Never raises on bad content: it sets `problem`."""
    taken = time.time() if taken_at is None else taken_at
    if len(data) < HEADER_BYTES:
        why = "empty file: the program never opened the tripwire" if not data else f"short file ({len(data)} bytes)"
        return Snapshot(path, taken, len(data), None, [], why)
    h = Header(*_HEADER.unpack_from(data, 0))
    if h.magic != MAGIC:
        return Snapshot(path, taken, len(data), None, [], f"bad magic 0x{h.magic:08x}: not a tripwire file")
    if h.version != VERSION or h.layout != LAYOUT or h.slot_words != SLOT_WORDS:
        return Snapshot(path, taken, len(data), h, [],
                        f"unsupported version {h.version} layout {h.layout} slot words {h.slot_words}")
    room = (len(data) - HEADER_BYTES) // (SLOT_WORDS * 8)
    n = min(h.workers, room)
    tag = tag_of(h.generation)
    words = struct.unpack_from(f"<{n * SLOT_WORDS}Q", data, HEADER_BYTES)
    slots = [decode_slot(w, words[w * SLOT_WORDS:(w + 1) * SLOT_WORDS], tag, h.max_warps) for w in range(n)]
    problem = None if n == h.workers else f"file holds {room} of {h.workers} slots (truncated)"
    return Snapshot(path, taken, len(data), h, slots, problem)


def read_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read and decode the file now (a plain read: the writer may be a live kernel)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return Snapshot(str(p), time.time(), 0, None, [], "tripwire file is gone")
    except OSError as e:
        return Snapshot(str(p), time.time(), 0, None, [], f"cannot read tripwire file: {e}")
    return decode(data, str(p))
