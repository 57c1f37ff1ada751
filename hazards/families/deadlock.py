"""Family `deadlock`: the persistent-grid deadlocks of the MI355 megakernel PR.

Kernels: `standalone/deadlock/deadlock.cu` (every wait instrumented with the tripwire;
phase/barrier names in `standalone/deadlock/deadlock_names.h`). More in docs/families/deadlock.md.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hazards.family import StaticVerdict, load_family


def epoch_hang_probability(p: dict[str, Any]) -> float:
    """Chance that the injected skew alone hangs one launch of the snapshot-epoch bug.

    A hang needs one non-participant to fall behind between its MoE arrival of layer k and
    its snapshot at layer k+1 (k < layers-1) for longer than the next merger takes; the
    injected delay (~200 µs at 400k cycles) is far longer than that path (~µs), so each
    skew event of a non-participant is fatal and the events are independent. A lower
    bound: the same race also fires without injection, at layer 0, when a non-participant
    block starts after the first merger has already bumped (block dispatch order).
    """
    if p["epoch_fix"] != "none":
        return 0.0
    opportunities = max(0, p["workers"] - p["participants"]) * max(0, p["layers"] - 1)
    q = p["skew_ppm"] / 1e6
    return 1.0 - (1.0 - q) ** opportunities


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Does this parameter point deadlock? From the parameters alone."""
    p = FAMILY.resolve(params)
    sc = p["scenario"]
    if sc == "grid_barrier":
        if p["grid_extra"] > 0:
            return StaticVerdict(True, f"grid is {p['grid_extra']} block(s) over the co-residency limit: "
                                       "the extra blocks never start, the barrier never completes", 1.0)
        return StaticVerdict(False, "grid fits the co-residency limit: every block is resident", 0.0)
    if sc == "chunk_count":
        arrivals = min(p["qkv_tiles"], p["chunks"]) if p["nested"] else p["chunks"]
        arrivals = min(arrivals, p["workers"])
        if arrivals < p["chunks"]:
            return StaticVerdict(True, f"only {arrivals} of {p['chunks']} chunk workers can arrive "
                                       "(chunk phase nested in the QKV guard)", 1.0)
        return StaticVerdict(False, f"all {p['chunks']} chunk ranks arrive", 0.0)
    prob = epoch_hang_probability(p)
    if p["epoch_fix"] != "none":
        return StaticVerdict(False, f"epoch_fix={p['epoch_fix']}: every expected value is ordered before its bump",
                             0.0)
    if p["participants"] >= p["workers"]:
        return StaticVerdict(False, "every worker arrives before the bump: no snapshot can follow it", 0.0)
    # The skew's rate is a lower bound (the natural race adds to it); without skew only the
    # natural race is left, which the model does not rate.
    return StaticVerdict(True, f"non-participants can read an already-bumped epoch; the injected skew alone "
                               f"hangs ~{prob:.1%} of launches, plus a natural race at layer 0 (a block that "
                               "starts after the first merger bumped)", prob if prob > 0 else None)


def strategy() -> Any:
    """Points over grid size, participants and layer count, every scenario and variant."""
    grid = st.fixed_dictionaries({
        "variant": st.sampled_from(["fixed_grid", "broken_grid"]),
        "grid_extra": st.integers(-64, 4), "rounds": st.integers(1, 4)})
    chunk = st.integers(1, 64).flatmap(lambda w: st.fixed_dictionaries({
        "variant": st.sampled_from(["fixed_chunk", "broken_chunk"]),
        "workers": st.just(w), "qkv_tiles": st.integers(0, w), "chunks": st.integers(1, w),
        "nested": st.booleans()}))
    epoch = st.integers(2, 96).flatmap(lambda w: st.fixed_dictionaries({
        "variant": st.sampled_from(["fixed_epoch", "fixed_epoch_widen", "broken_epoch"]),
        "workers": st.just(w), "participants": st.integers(1, w), "layers": st.integers(1, 12),
        "skew_ppm": st.sampled_from([0, 1000, 20000])}))
    return st.one_of(grid, chunk, epoch)


# Parameters, variants and their reasons: standalone/deadlock/family.toml.
FAMILY = load_family("deadlock", static_model=static_model, strategy=strategy)
