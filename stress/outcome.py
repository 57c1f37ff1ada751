"""The five outcomes of a run and the record that carries one.

Every run is exactly one of these. `error` is our own infrastructure (bad spec, build
failure, protocol garbage from a target we cannot interpret); it is never counted as a
hazard, and never as clean.
"""
from __future__ import annotations

import dataclasses
import enum
import socket
from typing import Any


class Outcome(str, enum.Enum):
    CLEAN = "clean"
    HANG = "hang"
    FAULT = "fault"
    MISMATCH = "mismatch"
    ERROR = "error"

    def __str__(self) -> str:  # so f-strings and JSON print "hang", not "Outcome.HANG"
        return self.value

    @property
    def is_failure(self) -> bool:
        """True for outcomes that count as an observed hazard (hang, fault, mismatch)."""
        return self in (Outcome.HANG, Outcome.FAULT, Outcome.MISMATCH)


OUTCOMES: tuple[Outcome, ...] = tuple(Outcome)
HOST = socket.gethostname()


def item_key(target: str, variant: str = "") -> str:
    """How runs of one target/variant are named and grouped: 'target/variant', or 'target'."""
    return f"{target}/{variant}" if variant else target


@dataclasses.dataclass
class RunResult:
    """One judged execution: a command run, or one server request.

    `evidence` holds what the verdict rests on (exit code, signal name, matched fault
    signature, the result line, the watchdog's collector output); `metrics` holds numbers
    reported by the target (launches, mismatched launches, max rel err, kernel time...).
    """

    outcome: Outcome
    reason: str
    target: str = ""
    variant: str = ""
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    started_at: float = 0.0
    duration_s: float = 0.0
    host: str = HOST
    gpu_uuid: str | None = None
    worker_age: int = 0
    artifact_dir: str | None = None
    error_kind: str | None = None

    @property
    def key(self) -> str:
        """The target/variant this run belongs to (`item_key`)."""
        return item_key(self.target, self.variant)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["outcome"] = self.outcome.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RunResult":
        """The inverse of `to_json` (keys that are not fields are ignored; a missing outcome
        is an error run)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["outcome"] = Outcome(kw.get("outcome", "error"))
        return cls(**kw)
