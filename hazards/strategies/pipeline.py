"""Parameter points for family `pipeline` (run-time fields only: no recompilation)."""
from __future__ import annotations

from typing import Any, Sequence

from hypothesis import strategies as st


def pipeline_points(variants: Sequence[str]) -> Any:
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
    return st.builds(lambda v, o: {"variant": v, **o}, st.sampled_from(list(variants)), overrides)
