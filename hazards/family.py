"""What a hazard family is: variants, a static model, a hypothesis strategy, an oracle.

A family module in `hazards/families/` defines a module-level `FAMILY = Family(...)`;
`hazards.families.all_families()` finds every one, so a new family is a new file (plus its
kernel folder under `standalone/`) and needs no registration anywhere else.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Literal

Role = Literal["reference", "fixed", "broken"]
Oracle = Literal["static", "sanitizer", "stress"]

REPO_ROOT = Path(__file__).resolve().parent.parent
STANDALONE = REPO_ROOT / "standalone"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One build/run configuration of a family.

    `role == "broken"` makes the variant a *canary*: it must be detected by every oracle in
    `detected_by` within the family's budget, or the check has gone blind.
    `params` are the variant's parameters (run-time request fields or -D defines by family).
    """

    name: str
    role: Role
    description: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    detected_by: tuple[Oracle, ...] = ()

    @property
    def is_canary(self) -> bool:
        return self.role == "broken"


@dataclasses.dataclass(frozen=True)
class StaticVerdict:
    """The static model's prediction for one parameter point."""

    hazardous: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class Family:
    """One hazard class of the catalog.

    `static_model(params)` predicts from the parameters alone whether a point is
    hazardous. `strategy()` returns a hypothesis strategy of parameter dicts (always with
    a `variant` key). `binary` names the harness binary built from
    `standalone/<source_dir>`; None for static-only families (checked on emitted code).
    """

    name: str
    summary: str
    variants: tuple[Variant, ...]
    static_model: Callable[[dict[str, Any]], StaticVerdict]
    strategy: Callable[[], Any]
    source_dir: str = ""
    binary: str | None = None
    platforms: tuple[str, ...] = ("cuda",)
    default_launches: int = 200
    timeout_s: float = 20.0
    runtime_params: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> doc
    # Metrics that, when > 0 in a failing run, mean the harness's own machinery went wrong
    # rather than the seeded hazard (e.g. ordering: a bounded spin that gave up, a litmus slot
    # never written). Such a run does not count as detecting a canary. Families whose seeded
    # hazard *is* a spin that never ends (barrier_layout's lost release) leave it empty.
    harness_anomalies: tuple[str, ...] = ()

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        from hazards.engine.errors import UserError

        known = ", ".join(v.name for v in self.variants)
        raise UserError(f"family {self.name!r} has no variant {name!r} (known: {known})")

    @property
    def canaries(self) -> tuple[Variant, ...]:
        return tuple(v for v in self.variants if v.is_canary)

    @property
    def clean_variants(self) -> tuple[Variant, ...]:
        return tuple(v for v in self.variants if not v.is_canary)

    @property
    def source_path(self) -> Path:
        return STANDALONE / (self.source_dir or self.name)
