"""The stall window of each run: set by the user, or calibrated from the store (docs/stall.md).

`--stall` on run, repro, stress, soak and check is `auto` (the default), `off`, or a
duration. `auto` gives an item the window calibrated from the gaps between progress events
of its clean runs stored so far (`CALIBRATION_FACTOR` times their 99.9th percentile, once
`MIN_CALIBRATION_GAPS` gaps are stored), never below `STALL_FLOOR_S`; an item that is not
calibrated yet keeps the window it was made with (a family's server beats every 100 ms:
`FAMILY_STALL_S`; a user's command has none until its clean runs calibrate it).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from .progress import bucket_upper_s

# The smallest window `auto` ever gives: 5 x the largest gap between progress events that
# clean runs showed under GPU contention and CPU load (0.196 s on an H100, rounded up;
# docs/stall.md, "The floor", docs/results/hangs-h100.md).
STALL_FLOOR_S = 1.0
# A family server's window before any calibration (its harness beats every 100 ms).
FAMILY_STALL_S = STALL_FLOOR_S
CALIBRATION_FACTOR = 5.0     # window = this many times the p99.9 gap of clean runs
CALIBRATION_QUANTILE = 0.999
MIN_CALIBRATION_GAPS = 200   # fewer stored gaps than this: no calibrated window yet
REFRESH_S = 30.0             # how often a campaign re-reads an item's calibration
# Handshakes: a new server gets this many times the slowest start-up its target showed,
# never less than HANDSHAKE_FLOOR_S (cold caches, a loaded machine) nor more than the default.
HANDSHAKE_FACTOR = 5.0
HANDSHAKE_FLOOR_S = 10.0
AUTO, OFF = "auto", "off"


def quantile_upper(gaps: dict[Any, int], q: float = CALIBRATION_QUANTILE) -> float | None:
    """The upper edge of the histogram bucket holding quantile `q` of the gaps (a bound:
    the true quantile is at most this); None for an empty histogram."""
    counts = sorted((int(k), int(n)) for k, n in gaps.items() if int(n) > 0)
    total = sum(n for _, n in counts)
    if not total:
        return None
    need = q * total
    seen = 0
    for k, n in counts:
        seen += n
        if seen >= need:
            return bucket_upper_s(k)
    return bucket_upper_s(counts[-1][0])


def calibrated_window(gaps: dict[Any, int]) -> float | None:
    """`CALIBRATION_FACTOR` x the p99.9 gap, at least `STALL_FLOOR_S`; None with too few gaps."""
    if sum(int(n) for n in gaps.values()) < MIN_CALIBRATION_GAPS:
        return None
    upper = quantile_upper(gaps)
    return None if upper is None else max(STALL_FLOOR_S, CALIBRATION_FACTOR * upper)


@dataclasses.dataclass
class _Cached:
    window: float | None
    read_at: float


class StallPolicy:
    """Which window each run gets in a campaign: `setting` is 'auto', 'off' or seconds;
    `store` (optional) holds the calibration. Thread-safe: every GPU loop asks it."""

    def __init__(self, setting: str | float = AUTO, store: Any = None) -> None:
        self.setting, self.store = setting, store
        self._mu = threading.Lock()
        self._cache: dict[str, _Cached] = {}
        self._handshakes: dict[str, float] = {}

    def window(self, item: Any) -> float | None:
        """The stall window of `item`'s next run (None: the timeout alone)."""
        if self.setting == OFF:
            return None
        if self.setting != AUTO:
            return float(self.setting)
        calibrated = self._calibrated(item.key)
        if calibrated is not None:
            return calibrated
        return item.stall_s

    def _calibrated(self, key: str) -> float | None:
        if self.store is None:
            return None
        now = time.monotonic()
        with self._mu:
            hit = self._cache.get(key)
            if hit is not None and now - hit.read_at < REFRESH_S:
                return hit.window
        try:
            row = self.store.progress_calibration(key)
        except Exception:  # a store that cannot answer leaves the item's own window
            row = None
        window = calibrated_window(row["gaps"]) if row else None
        with self._mu:
            self._cache[key] = _Cached(window, now)
        return window

    def handshake_timeout(self, item: Any, default: float) -> float:
        """A new server's handshake wait: from the slowest start-up stored for the item's
        target, else `default` (the timeout a target gets when it never started here)."""
        if self.store is None:
            return default
        with self._mu:  # read once per target: it is part of the warm server's key
            if item.target in self._handshakes:
                return self._handshakes[item.target]
        try:
            row = self.store.progress_calibration(item.target)  # start-ups are stored per target
        except Exception:
            row = None
        slowest = (row or {}).get("startup_max_s")
        wait = min(default, max(HANDSHAKE_FLOOR_S, HANDSHAKE_FACTOR * float(slowest))) if slowest else default
        with self._mu:
            return self._handshakes.setdefault(item.target, wait)


__all__ = ["StallPolicy", "calibrated_window", "quantile_upper", "STALL_FLOOR_S", "FAMILY_STALL_S",
           "CALIBRATION_FACTOR", "MIN_CALIBRATION_GAPS", "AUTO", "OFF"]
