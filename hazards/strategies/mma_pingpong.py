"""Parameter points for family `mma_pingpong` (run-time fields only: one binary serves all)."""
from __future__ import annotations

from typing import Any, Sequence

from hypothesis import strategies as st

from hazards.families.mma_pingpong import MAX_WAIT, SHAPES


def mma_pingpong_points(variants: Sequence[str]) -> Any:
    """A variant plus any subset of overrides: tile shape, banks, wait depth (including one
    too shallow), trip count with both parities and the small counts around the bank count,
    exit tail, accumulator-read placement, bulk or thread-store refills, jitter between the MMA issue and the refill, how
    long each tile's MMA batch reads its bank (`mma_reps`), and small grids (cheap on a GPU)."""
    overrides = st.fixed_dictionaries({}, optional={
        "shape": st.sampled_from(SHAPES),
        "stages": st.integers(1, 4),
        "wait_depth": st.integers(-1, MAX_WAIT),
        "tail": st.sampled_from(["parity", "single"]),
        "acc_read": st.sampled_from(["after_wait", "before_wait"]),
        "refill": st.sampled_from(["bulk", "threads"]),
        "ktiles": st.one_of(st.integers(1, 6), st.integers(7, 64)),
        "jitter": st.integers(0, 16),
        "mma_reps": st.sampled_from([1, 2, 4, 8, 16]),
        "blocks": st.sampled_from([1, 8, 66, 132]),
    })
    points = st.builds(lambda v, o: {"variant": v, **o}, st.sampled_from(list(variants)), overrides)
    return points.filter(_compiled_pair)


def _compiled_pair(point: dict[str, Any]) -> bool:
    """The thread refill is compiled with the accumulators read after the final wait only
    (the binary refuses the other pair)."""
    from hazards.families.mma_pingpong import FAMILY

    p = FAMILY.resolve(point)
    return not (p["refill"] == "threads" and p["acc_read"] == "before_wait")
