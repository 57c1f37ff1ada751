"""Family `pipeline`: a shared-memory ring feeding an FMA dot (NVIDIA counterpart of the
MFMA ping-pong hazards of the MI355 megakernel PR).

Kernel: `standalone/pipeline/pipeline.cu` (one template over stages x copy kind; every
other knob is a run-time parameter, so generators vary points without recompiling).
Hazards seeded by parameters: the WAR refill before the barrier (`war_barrier=false`),
a `cp.async.wait_group` one too shallow (`wait_depth` above the schedule's correct depth),
and the single exit tail (`tail="single"`: right only when T-1 is a multiple of S, i.e.
odd trip counts for a ping-pong). `static_model` decides hazardous vs safe from the
parameters alone; the outputs are compared bit-exactly with a plain dot product.
"""
from __future__ import annotations

from typing import Any

from hazards import presets
from hazards.family import Family, StaticVerdict, Variant

# The binary's declared defaults (pipeline.cu's ParamSpec list); tests/families checks
# this against `pipeline --list`.
DEFAULTS: dict[str, Any] = {
    "stages": 1, "copy": "plain", "war_barrier": True, "wait_depth": -1, "tail": "parity",
    "ktiles": 16, "jitter": 0, "blocks": 0,
}

VARIANTS = (
    Variant("reference", "reference", "single buffer, barriers on both sides: no overlap",
            params={"stages": 1, "copy": "plain"}),
    Variant("fixed", "fixed", "3-stage cp.async ring, correct wait depth, refill after the barrier",
            params={"stages": 3, "copy": "cp_async", "ktiles": 16}),
    Variant("fixed_pingpong", "fixed", "2-stage cp.async ping-pong, even trip count, parity-selected exit tail",
            params={"stages": 2, "copy": "cp_async", "ktiles": 16, "tail": "parity"}),
    Variant("broken_war", "broken", "single buffer refilled without the WAR barrier",
            params={"stages": 1, "copy": "plain", "war_barrier": False, "jitter": 4},
            detected_by=("stress", "sanitizer")),
    Variant("broken_wait", "broken", "3-stage cp.async ring waiting with cp.async.wait_group 2 instead of 1",
            params={"stages": 3, "copy": "cp_async", "wait_depth": 2}, detected_by=("stress",)),
    Variant("broken_tail", "broken", "2-stage ping-pong with a single exit tail, even trip count",
            params={"stages": 2, "copy": "cp_async", "ktiles": 16, "tail": "single"},
            detected_by=("stress",)),
)
_BY_NAME = {v.name: v for v in VARIANTS}

RUNTIME_PARAMS = {
    "stages": "ring slots, 1-4 (1 = single buffer)",
    "copy": "plain | cp_async: how tiles reach shared memory",
    "war_barrier": "refill a slot only after the barrier that ends its last read",
    "wait_depth": "cp.async groups allowed in flight at the wait (-1: the correct depth)",
    "tail": "parity | single: exit tail reads slot (T-1)%S, or always slot 0",
    "ktiles": "trip count T (K = 16*T), 1-256",
    "jitter": "per-warp random delay before each compute, up to jitter*128 clocks",
    "blocks": "grid size (0: 2 per SM)",
}


def resolve(params: dict[str, Any]) -> dict[str, Any]:
    """Defaults <- the named variant's preset <- explicit fields (as the binary resolves)."""
    return presets.resolve(DEFAULTS, VARIANTS, params)


def correct_wait_depth(stages: int, war_barrier: bool) -> int:
    """cp.async groups that may stay in flight when tile t is needed (pipeline.cu)."""
    if stages == 1:
        return 0
    return stages - 2 if war_barrier else stages - 1


def hazards(params: dict[str, Any]) -> list[str]:
    """Every hazard present at this parameter point, in words (empty: safe)."""
    p = resolve(params)
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

    return pipeline_points(tuple(_BY_NAME))


FAMILY = Family(
    name="pipeline",
    summary="shared-memory ring (1-4 stages, plain stores or cp.async) feeding an FMA dot: "
            "WAR refill, cp.async wait depth, single exit tail",
    variants=VARIANTS,
    static_model=static_model,
    strategy=strategy,
    source_dir="pipeline",
    binary="pipeline",
    platforms=("cuda",),
    default_launches=200,
    timeout_s=20.0,
    runtime_params=RUNTIME_PARAMS,
)
