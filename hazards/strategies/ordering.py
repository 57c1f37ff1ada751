"""Parameter points for family `ordering` (run-time fields only: no recompilation)."""
from __future__ import annotations

from typing import Any, Sequence

from hypothesis import strategies as st

SYNC_W = ["none", "fence", "release"]
SYNC_R = ["none", "fence", "acquire"]


def ordering_points(variants: Sequence[str]) -> Any:
    """A variant plus any subset of overrides: litmus shape, fences on each side, and the
    incantations, kept small enough that every grid is co-resident on one GPU and a batch
    takes milliseconds."""
    overrides = st.fixed_dictionaries({}, optional={
        "test": st.sampled_from(["mp", "sb", "lb", "corr", "pc"]),
        "writer_sync": st.sampled_from(SYNC_W),
        "reader_sync": st.sampled_from(SYNC_R),
        "test_blocks": st.sampled_from([2, 3, 8, 32, 66]),
        "threads": st.sampled_from([32, 64, 128, 256]),
        "stride": st.sampled_from([1, 2, 8, 32]),
        "permute": st.booleans(),
        "shuffle": st.booleans(),
        "barrier": st.booleans(),
        "stress_blocks": st.sampled_from([0, 4, 32]),
        "stress_lines": st.sampled_from([1, 8, 64, 1024]),
        "stress_pattern": st.sampled_from(["st_st", "st_ld", "ld_st", "ld_ld"]),
        "stress_iters": st.sampled_from([0, 256, 2048]),
        "pre_stress": st.sampled_from([0, 16, 128]),
        "iters": st.integers(1, 32),
        "elems": st.sampled_from([1, 4, 16]),
    })
    return st.builds(lambda v, o: {"variant": v, **o}, st.sampled_from(list(variants)), overrides)
