"""Reading the layered megakernel's SASS (nvdisasm -c listings) in the codegen tests: each
device function's lines, and how many global loads go out ahead of the arithmetic (the layer
head's tasks, test_head_codegen.py; step (d)'s spread merge, test_merge_spread.py; the weight
ring, test_weight_ring.py)."""
from __future__ import annotations

import re
from typing import Iterable

MERGE_BATCH = 16  # mkl_kernel.cuh MERGE_BATCH: the chunk partials weighed per pass of the merge


def function_listings(listing: str, names: Iterable[str]) -> dict[str, str]:
    """{name: its lines} for each of `names` that a function of the listing is named by: a label
    line other than a local `.L` one opens a function (`.text.KERNEL:` a kernel, `$KERNEL$FUNC:`
    a device function inside it), kept under the first of `names` that its symbol's last `$`
    part contains, or skipped."""
    names = list(names)
    funcs: dict[str, str] = {}
    name = None
    for line in listing.splitlines():
        label = re.match(r"^(\S+):\s*$", line)
        if label and not line.startswith(".L"):
            symbol = label.group(1).removeprefix(".text.").split("$")[-1]
            name = next((n for n in names if n in symbol), None)
            if name:
                funcs.setdefault(name, "")
        elif name:
            funcs[name] += line + "\n"
    return funcs


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
