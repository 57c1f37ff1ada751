"""Reading a SASS listing for loads issued ahead: the layer head's tasks (test_head_codegen.py)
and step (d)'s spread merge (test_merge_spread.py) must each issue a batch's global loads
before the arithmetic that consumes them."""
from __future__ import annotations

import re

MERGE_BATCH = 16  # mkl_kernel.cuh MERGE_BATCH: the chunk partials weighed per pass of the merge


def longest_load_run(sass: str, load: str = r"\bLDG\.") -> int:
    """The most global loads (matching `load`) issued in a row before an FFMA (other
    instructions between them do not end a run)."""
    best = run = 0
    for line in sass.splitlines():
        if re.search(load, line):
            run += 1
            best = max(best, run)
        elif re.search(r"\bFFMA\b", line):
            run = 0
    return best
