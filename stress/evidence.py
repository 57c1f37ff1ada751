"""What the runs of one item prove, per run and per launch: the numbers evidence is spent on.

A run is one launch for some targets (a command, the megakernel's `--once`) and hundreds
for others (a batch on a family's launch server), so a rate per run is not comparable
across items; a rate per launch is. `Evidence` counts both: the runs (an `ItemTally`,
with the item's proof) and the launches they made, failed launches among them, and when
a canary was first proved failing, and what the replies measured on the way (weak litmus
outcomes per instance, kernel time, bad elements, sanitizer errors). `hazards soak` (the
evidence allocation and its report), `hazards check` (the per-launch bound stated for each
clean variant), `hazards stress` (its table and JSON) and the allocation benchmark read the
same numbers from here, so a hung run is "1 of 1 launches failed" in every command.
More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from .outcome import Outcome, RunResult
from .stats import format_rate, upper_bound
from .verdict import ItemTally, Proof


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return int(value) if value >= 0 else None


def launches_of(result: RunResult) -> tuple[int, int]:
    """(launches, failed launches) one run made (docs/campaigns.md, In the code)."""
    outcome = Outcome(result.outcome)
    if outcome is Outcome.ERROR:
        return 0, 0
    metrics = result.metrics or {}
    launches = _count(metrics.get("launches")) or 1
    if outcome is Outcome.CLEAN:
        return launches, 0
    if outcome is Outcome.MISMATCH:
        bad = _count(metrics.get("mismatched")) or 1
        return launches, min(bad, launches)
    return launches, 1  # hang / fault: the launch that never finished (or faulted)


@dataclasses.dataclass
class Evidence(ItemTally):
    """One item's runs (outcome counts, proved failures) and the launches they made."""

    launches: int = 0
    failed_launches: int = 0
    first_detection: int | None = None  # the run (1-based) of the first proved failure
    runs_after_detection: int = 0       # runs made after that one
    # Summed over the replies of clean and mismatched runs (a hang or fault has no reply):
    instances: float = 0.0              # litmus instances tested, and the weak outcomes among them
    weak: float = 0.0
    kernel_ms: float = 0.0
    bad_elements: int = 0
    max_rel_err: float = 0.0
    sanitizer_errors: int = 0           # what compute-sanitizer reported, any outcome

    def add(self, result: RunResult, proof: Proof = Proof()) -> None:
        """Count one run (its proof decides whether a failure proves the item's hazard)."""
        before = self.proved
        super().add(result, proof)
        launches, failed = launches_of(result)
        self.launches += launches
        self.failed_launches += failed
        m = result.metrics or {}
        if Outcome(result.outcome) in (Outcome.CLEAN, Outcome.MISMATCH):
            self.instances += float(m.get("instances") or 0.0)
            self.weak += float(m.get("weak") or 0.0)
            self.kernel_ms += float(m.get("kernel_ms") or 0.0)
            self.bad_elements += int(m.get("bad_elements") or 0)
            self.max_rel_err = max(self.max_rel_err, float(m.get("max_rel_err") or 0.0))
        self.sanitizer_errors += int(((result.evidence or {}).get("sanitizer") or {}).get("errors") or 0)
        if self.first_detection is not None:
            self.runs_after_detection += 1
        elif self.proved > before:
            self.first_detection = self.n

    @property
    def detected(self) -> bool:
        return self.first_detection is not None

    def run_upper(self, conf: float = 0.95) -> float:
        """One-sided upper bound on the failure rate per run."""
        return upper_bound(self.failures, self.judged, conf)

    def launch_upper(self, conf: float = 0.95) -> float:
        """One-sided upper bound on the failure rate per launch."""
        return upper_bound(min(self.failed_launches, self.launches), self.launches, conf)

    def launch_upper_if(self, more_launches: int, conf: float = 0.95) -> float:
        """The per-launch bound if `more_launches` launches in flight come back clean."""
        n = self.launches + max(0, more_launches)
        return upper_bound(min(self.failed_launches, n), n, conf)

    @property
    def launches_per_run(self) -> float:
        """Mean launches per judged run (1 before any)."""
        return self.launches / self.judged if self.judged else 1.0

    def run_rate_text(self, conf: float = 0.95) -> str:
        return format_rate(self.failures, self.judged, conf)

    def launch_rate_text(self, conf: float = 0.95) -> str:
        return format_rate(min(self.failed_launches, self.launches), self.launches, conf)

    def to_json(self, conf: float = 0.95) -> dict[str, Any]:
        return {"runs": self.n, "judged": self.judged, "failures": self.failures, "proved": self.proved,
                "errors": self.errors, "launches": self.launches, "failed_launches": self.failed_launches,
                "run_upper": self.run_upper(conf), "launch_upper": self.launch_upper(conf),
                "run_rate": self.run_rate_text(conf), "launch_rate": self.launch_rate_text(conf),
                "first_detection": self.first_detection, "runs_after_detection": self.runs_after_detection}


def evidence_of(runs: Iterable[RunResult], proofs: dict[str, Proof]) -> dict[str, Evidence]:
    """{target/variant: Evidence} of runs in the order given (a campaign's stored order),
    each counted with its item's proof (`proofs[key]`, else the default `Proof()`)."""
    out: dict[str, Evidence] = {}
    for r in runs:
        out.setdefault(r.key, Evidence()).add(r, proofs.get(r.key, Proof()))
    return out
