"""From a failing family point to numbers and a command: the rate at the point, the replay line.

A property test that fails on a family point says "this point failed once". What an
engineer needs next is (a) how often it fails there: the point re-run R times, reported as
k/R with an exact confidence interval, and (b) one command that replays it outside
pytest: `hazards repro --family F --params JSON`. This module provides both, and the
`hypothesis.target` helper that steers generation toward points with higher mismatch rates.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from typing import Any, Callable, TextIO

from hazards.engine.outcome import Outcome, RunResult

RunPoint = Callable[[dict[str, Any]], RunResult]


def params_json(params: dict[str, Any]) -> str:
    """The canonical JSON text of a parameter point (sorted keys, no spaces)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def repro_argv(family: str, params: dict[str, Any]) -> list[str]:
    """argv of the command that replays `params` of `family` outside pytest."""
    return ["hazards", "repro", "--family", family, "--params", params_json(params)]


def repro_command(family: str, params: dict[str, Any]) -> str:
    """The shell line that replays the point: `hazards repro --family F --params '{...}'`."""
    return shlex.join(repro_argv(family, params))


def print_repro(family: str, params: dict[str, Any], file: TextIO | None = None) -> str:
    """Print the replay line (to stderr by default) and return it."""
    line = repro_command(family, params)
    print(f"replay this point: {line}", file=file or sys.stderr)
    return line


@dataclasses.dataclass
class PointRate:
    """A parameter point re-run `n` times: how many runs failed and the interval on the rate."""

    family: str
    params: dict[str, Any]
    failed: int
    n: int
    counts: dict[str, int]
    low: float
    high: float
    conf: float = 0.95

    @property
    def rate(self) -> float:
        return self.failed / self.n if self.n else 0.0

    def text(self) -> str:
        """One line: `7/20 runs failed: 35% (95% CI 15%–59%); hang 2, mismatch 5`."""
        from hazards.engine.stats import format_rate

        parts = ", ".join(f"{o} {c}" for o, c in sorted(self.counts.items()) if c and o != "clean")
        detail = f"; {parts}" if parts else ""
        return f"{self.failed}/{self.n} runs failed: {format_rate(self.failed, self.n, self.conf)}{detail}"


def measure_point(family: str, params: dict[str, Any], run_point: RunPoint, runs: int,
                  conf: float = 0.95) -> PointRate:
    """Re-run one point `runs` times through `run_point` and report k/R with an exact CI.

    A run counts as failed when its outcome is a hazard (hang, fault, mismatch); `error`
    runs (our own infrastructure) count neither way and are excluded from R.
    """
    from hazards.engine.stats import rate_ci

    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    counts = {o.value: 0 for o in Outcome}
    for _ in range(runs):
        counts[run_point(dict(params)).outcome.value] += 1
    failed = sum(c for o, c in counts.items() if Outcome(o).is_failure)
    n = runs - counts[Outcome.ERROR.value]
    low, high = rate_ci(failed, n, conf=conf, method="exact")
    return PointRate(family, dict(params), failed, n, counts, low, high, conf)


def mismatch_rate(result: RunResult) -> float | None:
    """Share of launches that mismatched in one run (a continuous rate), if it says so.

    Reads the server reply's counts (`mismatched` / `launches`, docs/protocol.md). A hang
    or fault counts as rate 1.0: the point broke as badly as it can. None when the run
    reported no launch counts (a command target without a result line).
    """
    if result.outcome in (Outcome.HANG, Outcome.FAULT):
        return 1.0
    launches = result.metrics.get("launches")
    mismatched = result.metrics.get("mismatched")
    if not isinstance(launches, (int, float)) or not isinstance(mismatched, (int, float)) or launches <= 0:
        return None
    return float(mismatched) / float(launches)


def target_mismatch_rate(result: RunResult, label: str = "mismatch rate") -> float | None:
    """Call `hypothesis.target` with the run's mismatch rate (and max relative error).

    Steers hypothesis toward points where more launches go wrong, for families whose
    failures come as a continuous rate rather than all-or-nothing. Returns the rate
    targeted, or None when the run reported none. Must be called inside a @given test.
    """
    from hypothesis import target

    rate = mismatch_rate(result)
    if rate is not None:
        target(rate, label=label)
    err = result.metrics.get("max_rel_err")
    if isinstance(err, (int, float)) and err == err and err not in (float("inf"), float("-inf")):
        target(float(err), label="max rel err")
    return rate


def failure_note(family: str, params: dict[str, Any], rate: PointRate | None,
                 result: RunResult | None = None) -> str:
    """The text a failing family point is reported with: parameters, rate, replay line."""
    lines = [f"family {family}, failing point: {params_json(params)}"]
    if result is not None:
        lines.append(f"last run at this point: {result.outcome.value}: {result.reason}")
    if rate is not None:
        lines.append(f"rate at this point: {rate.text()}")
    lines.append(f"replay: {repro_command(family, params)}")
    return "\n".join(lines)
