"""Failure signatures: group repeated failures that differ only in incidental details.

Two runs fail "the same way" when they share the outcome, the error kind, the target and
variant, and the failure message once everything that changes from run to run is
stripped: numbers, hex addresses, pids, GPU UUIDs, temporary paths. A signature's `key`
is a stable hash of those five parts; the store counts runs per key. A hang that the
hang-forensics collector located is grouped by its stuck locations instead of its message.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re

from .forensics.collector import stuck_locations
from .outcome import Outcome, RunResult

MAX_MESSAGE = 200

# Order matters: the specific patterns run before the generic number pattern.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bGPU-[0-9a-fA-F-]{8,}"), "<gpu>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"0[xX][0-9a-fA-F]+"), "<addr>"),
    # absolute or ./relative paths with at least one separator (keeps "a/b" ratios apart
    # from paths by requiring a leading / or ./ or ~/)
    (re.compile(r"(?:(?<=\s)|(?<=^)|(?<=[(\[\"'=:]))(?:~|\.{1,2})?/[^\s:'\"()\[\],]+"), "<path>"),
    (re.compile(r"\b(pid|tid|process|thread)[ =:#]*\d+", re.IGNORECASE), r"\1 <n>"),
    (re.compile(r"\b[0-9a-fA-F]{12,}\b"), "<hex>"),
    (re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<n>"),
)
_SPACE = re.compile(r"\s+")


def normalize_message(text: str) -> str:
    """Strip what varies between repeats of one failure (numbers, addresses, pids, paths).

    >>> normalize_message("pid 4242: illegal address at 0x7f00dead in /tmp/hz_8s/k.cu:45")
    'pid <n>: illegal address at <addr> in <path>:<n>'
    """
    out = text or ""
    for pattern, repl in _RULES:
        out = pattern.sub(repl, out)
    out = _SPACE.sub(" ", out).strip()
    return out[:MAX_MESSAGE]


@dataclasses.dataclass(frozen=True)
class SignatureKey:
    """The parts two failures must share to count as the same failure."""

    outcome: str
    error_kind: str
    target: str
    variant: str
    message: str

    @property
    def key(self) -> str:
        """Stable short hash of the parts (the store's unique key)."""
        blob = json.dumps(dataclasses.astuple(self), ensure_ascii=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]


def signature_of(result: RunResult) -> SignatureKey | None:
    """The failure signature of a run; None for a clean run (nothing to group)."""
    outcome = Outcome(result.outcome)
    if outcome is Outcome.CLEAN:
        return None
    stuck = stuck_locations(result.evidence) if outcome is Outcome.HANG else []
    # A hang whose stuck locations are known is grouped by them, exactly (line numbers
    # are the point): two hangs at the same source lines are one signature.
    message = ("stuck at " + ", ".join(stuck))[:MAX_MESSAGE] if stuck else normalize_message(result.reason)
    return SignatureKey(
        outcome=outcome.value,
        error_kind=result.error_kind or "",
        target=result.target or "",
        variant=result.variant or "",
        message=message,
    )
