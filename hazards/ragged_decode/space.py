"""The ragged-decode megakernel target's configuration space, for `hazards explore ragged_decode`.

The reference megakernel (`standalone/megakernel/`, the ragged-decode contract) is soaked
with the contract's fixed multiset of lengths (`hazards.ragged_decode.check`). Its correctness
must not depend on that multiset: the device schedule ranks requests, cuts them into tiles
and merges partials for any lengths, any grid and any tile size. This module states that
space once, as a `Family` (parameters checked by the one resolver, variants, a static model
with a rate per launch, a hypothesis strategy) that is not in the catalog (there is no
harness binary: the target is `python3 -m hazards.ragged_decode.check --serve`, which takes
these fields per request and rebuilds its arena and schedule when they change).
More in docs/megakernel.md.
"""
from __future__ import annotations

import dataclasses
import random
import sys
from typing import Any

from hypothesis import strategies as st

from hazards.family import Family, Param, StaticVerdict, Variant

DISTS = ("contract", "uniform", "equal", "one_long", "halving", "with_empty")
SCHEDULES = ("split", "guided", "per_request")
MISHANDLINGS = ("none", "clamp8192", "ignore_starts")
SPLITS = (256, 512, 1024, 2048, 4096, 8192)
CLAMP = 8192
MAX_TOKENS = 1 << 20  # arena rows a request may ask for (4 GiB of bf16 K and V at 8 x 128)
CONFIG_KEYS = ("dist", "batch", "max_len", "lens_scale", "lens_seed", "grid", "split_tokens", "schedule")

PARAMS = (
    Param("dist", "str", "contract", "length distribution of the batch", choices=DISTS),
    Param("batch", "int", 64, "requests B (not for dist=contract: its 128)", 1, 256),
    Param("max_len", "int", 8192, "longest request (not for dist=contract)", 1, 65536),
    Param("lens_scale", "int", 1, "divide every length by this", 1, 64),
    Param("lens_seed", "int", 0, "seed of the drawn lengths", 0, 2 ** 31 - 1),
    Param("grid", "int", 0, "persistent blocks (0: every SM's resident limit)", 0, 4096),
    Param("split_tokens", "int", 2048, "tile size of the split schedule", choices=SPLITS, min=256, max=8192),
    Param("schedule", "str", "split", "device schedule", choices=SCHEDULES),
    Param("mishandle", "str", "none", "feed the kernel a known-bad input (a canary)", choices=MISHANDLINGS),
)
VARIANTS = (
    Variant("reference", "reference", "the contract's multiset, split into 2048-token tiles, every SM"),
    Variant("clamp8192", "broken", "every length clamped at 8192 (the reference keeps the true ones)",
            params={"mishandle": "clamp8192"}, detected_by=("stress",)),
    Variant("ignore_starts", "broken", "every request read from the top of the arena",
            params={"mishandle": "ignore_starts"}, detected_by=("stress",)),
)


def lens_of(params: dict[str, Any]) -> list[int]:
    """The request lengths of a point (deterministic in its fields)."""
    p = SPACE.resolve(params)
    scale, dist = p["lens_scale"], p["dist"]
    if dist == "contract":
        from hazards.ragged_decode.reference import CONTRACT_LENS

        return [max(1, n // scale) for n in CONTRACT_LENS]
    rng = random.Random(p["lens_seed"])
    b, top = p["batch"], max(1, p["max_len"] // scale)
    if dist == "uniform":
        lens = [rng.randint(1, top) for _ in range(b)]
    elif dist == "equal":
        lens = [top] * b
    elif dist == "one_long":
        lens = [top] + [rng.randint(1, min(64, top)) for _ in range(b - 1)]
    elif dist == "halving":
        lens = [max(1, top >> (i % 12)) for i in range(b)]
    else:  # with_empty
        lens = [0 if i % 4 == 3 else rng.randint(1, top) for i in range(b)]
    return lens


def config_of(params: dict[str, Any]) -> dict[str, Any]:
    """What the server builds an arena and a schedule for: lengths, grid, tile, schedule."""
    p = SPACE.resolve(params)
    return {"lens": lens_of(p), "grid": p["grid"] or None, "split_tokens": p["split_tokens"],
            "schedule": p["schedule"]}


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Correct wherever the host accepts the point; a mishandling is hazardous where it
    bites, in every call (rate 1: the calibrated distances are 16x and 140x the tolerance)."""
    p = SPACE.resolve(params)
    lens = lens_of(p)
    if sum(lens) > MAX_TOKENS:
        return StaticVerdict(False, f"{sum(lens):,} tokens > {MAX_TOKENS:,}: the server refuses the point", 0.0)
    clamp = max(1, CLAMP // p["lens_scale"])
    if p["mishandle"] == "clamp8192":
        if max(lens) > clamp:
            return StaticVerdict(True, f"lengths up to {max(lens)} are clamped at {clamp}: those requests lose "
                                       "their tail", 1.0)
        return StaticVerdict(False, f"no length exceeds the clamp {clamp}: clamping changes nothing", 0.0)
    if p["mishandle"] == "ignore_starts":
        if sum(1 for n in lens if n > 0) >= 2:
            return StaticVerdict(True, "every request reads the arena's first segment instead of its own", 1.0)
        return StaticVerdict(False, "at most one request holds tokens, and its segment starts at row 0 (empty "
                                    "segments take no rows): ignoring starts reads the right rows", 0.0)
    return StaticVerdict(False, f"{len(lens)} requests, {sum(lens):,} tokens, {p['schedule']} schedule: the "
                                "device schedule covers every token once and merges every partial", 0.0)


def strategy() -> Any:
    """Points over the length distribution, batch, longest length, scale, grid, tile and
    schedule, with and without a mishandling."""
    overrides = st.fixed_dictionaries({}, optional={
        "dist": st.sampled_from(DISTS),
        "batch": st.integers(1, 160),
        "max_len": st.sampled_from([1, 17, 2047, 2048, 2049, 8192, 8193, 16384, 65536]),
        "lens_scale": st.sampled_from([1, 2, 8, 16]),
        "lens_seed": st.integers(0, 1000),
        "grid": st.sampled_from([0, 1, 7, 66, 132, 264]),
        "split_tokens": st.sampled_from(SPLITS),
        "schedule": st.sampled_from(SCHEDULES),
    })
    return st.builds(lambda v, o: {"variant": v, **o}, st.sampled_from([v.name for v in VARIANTS]), overrides)


def item_for(point: dict[str, Any]) -> Any:
    """The work item of a point: a request to the megakernel check server with every field
    resolved (the server knows no variants)."""
    from hazards.engine.loop import WorkItem

    resolved = {**SPACE.resolve(point), "variant": point.get("variant", VARIANTS[0].name)}
    return WorkItem(target=SPACE.name, variant=f"explore:{resolved['variant']}", kind="server",
                    argv=(sys.executable, "-m", "hazards.ragged_decode.check", "--serve"), params=resolved,
                    launches=SPACE.default_launches, timeout_s=SPACE.timeout_s, respawn_every=200)


SPACE = Family(name="ragged_decode", summary="the ragged-decode megakernel target over lengths, grid, tile, "
               "schedule", variants=VARIANTS, params=PARAMS, static_model=static_model, strategy=strategy,
               default_launches=4, timeout_s=120.0)
SPACE = dataclasses.replace(SPACE, runtime_params={p.name: p.summary() for p in PARAMS})
