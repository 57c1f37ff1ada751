"""Family `pipeline`: a shared-memory ring feeding an FMA dot (NVIDIA counterpart of the
MFMA ping-pong hazards of the MI355 megakernel PR).

Kernel: `standalone/pipeline/pipeline.cu` (one template over stages x copy kind; every
other knob is a run-time parameter, so generators vary points without recompiling).
Parameters and variants, with the reasons: `standalone/pipeline/family.toml`.
Hazards seeded by parameters: the WAR refill before the barrier (`war_barrier=false`),
a `cp.async.wait_group` one too shallow (`wait_depth` above the schedule's correct depth),
and the single exit tail (`tail="single"`: right only when T-1 is a multiple of S, i.e.
odd trip counts for a ping-pong). `static_model` decides hazardous vs safe from the
parameters alone; the outputs are compared bit-exactly with a plain dot product.
"""
from __future__ import annotations

from typing import Any

from hazards.family import StaticVerdict, load_family


def correct_wait_depth(stages: int, war_barrier: bool) -> int:
    """cp.async groups that may stay in flight when tile t is needed (pipeline.cu)."""
    if stages == 1:
        return 0
    return stages - 2 if war_barrier else stages - 1


def hazards(params: dict[str, Any]) -> list[str]:
    """Every hazard present at this parameter point, in words (empty: safe)."""
    p = FAMILY.resolve(params)
    s, t = int(p["stages"]), int(p["ktiles"])
    found = []
    if not p["war_barrier"] and t >= s + 1:
        found.append(f"WAR: slot (t-1)%{s} is refilled before the barrier that ends its last read "
                     f"(first at trip 1 of {t})")
    if p["copy"] == "cp_async":
        right = correct_wait_depth(s, bool(p["war_barrier"]))
        depth = right if p["wait_depth"] < 0 else int(p["wait_depth"])
        if depth > right:
            found.append(f"RAW: cp.async.wait_group {depth} leaves tile t in flight (correct: {right})")
    if p["tail"] == "single" and (t - 1) % s != 0:
        found.append(f"exit tail reads slot 0 but the last tile (T={t}) sits in slot {(t - 1) % s}")
    return found


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous or safe from the parameters alone (the WAR race needs T >= S+1 trips to
    exist; whether it shows in a given launch depends on timing, hence `jitter`)."""
    found = hazards(params)
    if found:
        return StaticVerdict(True, "; ".join(found))
    return StaticVerdict(False, "refill after the barrier, wait depth within the correct one, "
                                "exit tail matches the trip count")


def strategy() -> Any:
    """Hypothesis strategy over run-time parameter points (see hazards/strategies)."""
    from hazards.strategies.pipeline import pipeline_points

    return pipeline_points(tuple(v.name for v in FAMILY.variants))


# Parameters, variants and their reasons: standalone/pipeline/family.toml.
FAMILY = load_family("pipeline", static_model=static_model, strategy=strategy)
