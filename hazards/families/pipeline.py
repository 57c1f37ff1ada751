"""Family `pipeline`: a shared-memory ring feeding an FMA dot.

The NVIDIA counterpart of the MFMA ping-pong hazards of the MI355 megakernel PR. Kernel:
`standalone/pipeline/pipeline.cu` (one template over stages x copy kind; every other knob is a
run-time parameter, so generators vary points without recompiling). Parameters and variants,
with the reasons: `standalone/pipeline/family.toml`. Hazards seeded by parameters: the WAR
refill before the barrier (`war_barrier=false`), a `cp.async.wait_group` one too shallow
(`wait_depth` above the schedule's correct depth), and the single exit tail (`tail="single"`:
right only when T-1 is a multiple of S, i.e. odd trip counts for a ping-pong). `static_model`
decides hazardous vs safe from the parameters alone; the outputs are compared bit-exactly with
a plain dot product.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hazards.family import StaticVerdict, combined_rate, load_family


def correct_wait_depth(stages: int, war_barrier: bool) -> int:
    """cp.async groups that may stay in flight when tile t is needed (pipeline.cu)."""
    if stages == 1:
        return 0
    return stages - 2 if war_barrier else stages - 1


# What the model predicts per launch on the H200 (docs/results/families-h200.md): the single
# exit tail reads a wrong slot in every launch (10,000/10,000 at broken_tail); a wait one
# group too shallow raced in 44% of launches at broken_wait's point (the model claims a
# tenth of that anywhere: the race needs the copy to land late); the single-buffer WAR with
# jitter raced in every launch at broken_war's point (claimed: a tenth). The WAR race with
# more stages, or with no jitter, is timing-dependent and not rated.
# The RAW rate holds only where it was measured and no lighter: broken_wait's grid (2 blocks
# per SM, or more) and trip count (16 tiles, or more). `hazards explore pipeline` on the H200
# (docs/results/explore-h200.md) found it 0 in 600 launches at 4 blocks, 0 in 200 at 16
# blocks, 0 in 200 at 5 tiles and 1-2 in 200 at 1-2 tiles: with few blocks or few trips the
# late copy lands before it is read, so there the model does not rate it.
TAIL_RATE = 1.0
RAW_RATE = 0.044
RAW_RATE_MIN_TILES = 16
RAW_RATE_MIN_BLOCKS = 264  # 2 per SM on the H200's 132 SMs: what `blocks = 0` launches there
WAR_JITTER_RATE = 0.1


def hazards_with_rates(params: dict[str, Any]) -> list[tuple[str, float | None]]:
    """Every hazard present at this parameter point, in words, with the per-launch rate the
    model predicts for it on the H200 (None: not rated). Empty: safe."""
    p = FAMILY.resolve(params)
    s, t = int(p["stages"]), int(p["ktiles"])
    found: list[tuple[str, float | None]] = []
    if not p["war_barrier"] and t >= s + 1:
        rate = WAR_JITTER_RATE if s == 1 and int(p["jitter"]) > 0 else None
        found.append((f"WAR: slot (t-1)%{s} is refilled before the barrier that ends its last read "
                      f"(first at trip 1 of {t})", rate))
    if p["copy"] == "cp_async":
        right = correct_wait_depth(s, bool(p["war_barrier"]))
        depth = right if p["wait_depth"] < 0 else int(p["wait_depth"])
        if depth > right:
            blocks = int(p["blocks"])
            loaded = t >= RAW_RATE_MIN_TILES and (blocks == 0 or blocks >= RAW_RATE_MIN_BLOCKS)
            found.append((f"RAW: cp.async.wait_group {depth} leaves tile t in flight (correct: {right})",
                          RAW_RATE if loaded else None))
    if p["tail"] == "single" and (t - 1) % s != 0:
        found.append((f"exit tail reads slot 0 but the last tile (T={t}) sits in slot {(t - 1) % s}", TAIL_RATE))
    return found


def hazards(params: dict[str, Any]) -> list[str]:
    """Every hazard present at this parameter point, in words (empty: safe)."""
    return [what for what, _ in hazards_with_rates(params)]


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous or safe from the parameters alone (the WAR race needs T >= S+1 trips to
    exist; whether it shows in a given launch depends on timing, hence `jitter`), with the
    per-launch rate predicted on the H200 (`combined_rate` of the hazards present)."""
    found = hazards_with_rates(params)
    if found:
        return StaticVerdict(True, "; ".join(w for w, _ in found), combined_rate([r for _, r in found]))
    return StaticVerdict(False, "refill after the barrier, wait depth within the correct one, "
                                "exit tail matches the trip count", 0.0)


def strategy() -> Any:
    """A variant plus any subset of overrides: stages, copy kind, barrier placement, wait
    depth, exit tail, trip count (both parities), jitter, and small grids (cheap on a GPU)."""
    overrides = st.fixed_dictionaries({}, optional={
        "stages": st.integers(1, 4),
        "copy": st.sampled_from(["plain", "cp_async"]),
        "war_barrier": st.booleans(),
        "wait_depth": st.integers(-1, 4),
        "tail": st.sampled_from(["parity", "single"]),
        "ktiles": st.integers(1, 40),
        "jitter": st.integers(0, 8),
        "blocks": st.sampled_from([4, 16, 66, 264]),
    })
    variants = st.sampled_from([v.name for v in FAMILY.variants])
    return st.builds(lambda v, o: {"variant": v, **o}, variants, overrides)


# Parameters, variants and their reasons: standalone/pipeline/family.toml.
FAMILY = load_family("pipeline", static_model=static_model, strategy=strategy)
