"""Named builds/configurations of the ragged-decode megakernel for the faithful perf gate.

A candidate is what a kernel engineer would propose as a change: a different copy scheme,
tile size, a rebuild. The gate (`hazards gate perf --baseline megakernel:baseline
--candidate megakernel:NAME`) must rank each one correctly; `expected` says how, and
docs/results/gates-h200.md shows what it said on the H200. More in docs/megakernel.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from hazards.engine.errors import UserError


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One named configuration; `expected` is the verdict against `baseline`."""

    name: str
    what: str
    expected: str
    copies: str = "rows"
    split_tokens: int = 2048
    stall_cycles: int = 0
    mishandle: str = "none"
    defines: tuple[str, ...] = ()

    def handle_key(self) -> tuple[Any, ...]:
        """What a built handle depends on (the mishandling is an input, not a build)."""
        return (self.copies, self.split_tokens, self.stall_cycles, self.defines)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CANDIDATES: dict[str, Candidate] = {c.name: c for c in (
    Candidate("baseline", "row-by-row bulk copies into padded rows (before the contiguous-copy change)",
              "no-change"),
    Candidate("improved", "one bulk copy per 16-token stage and tensor (the change that landed)", "faster",
              copies="contiguous"),
    Candidate("noop", "the baseline from a separately compiled library (unused -D)", "no-change",
              defines=("HZ_RD_NOOP_CANDIDATE",)),
    Candidate("slower", "the baseline with consumers idling 6000 cycles per stage", "slower",
              stall_cycles=6000),
    Candidate("sloughing", "the baseline cut into 512-token tiles: 4x the pieces for the same work",
              "sloughing", split_tokens=512),
    Candidate("incorrect", "the baseline fed every length clamped at 8192 (less work, wrong answer)",
              "incorrect", mishandle="clamp8192"),
    Candidate("production", "the megakernel as it ships (contiguous copies, 2048-token tiles)", "faster",
              copies="contiguous"),
)}


def get(name: str) -> Candidate:
    """The candidate called `name`; UserError naming the known ones otherwise."""
    try:
        return CANDIDATES[name]
    except KeyError:
        raise UserError(f"unknown megakernel candidate {name!r} (known: {', '.join(CANDIDATES)})") from None
