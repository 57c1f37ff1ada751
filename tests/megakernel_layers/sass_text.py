"""Reading the layered megakernel's SASS (nvdisasm -c listings) in the codegen tests: each
device function's lines, and how many global loads go out ahead of the arithmetic (the layer
head's tasks, test_head_codegen.py; step (d)'s spread merge, test_merge_spread.py; the weight
ring, test_weight_ring.py; step (f)'s attention, test_attention_ahead.py)."""
from __future__ import annotations

import re
from typing import Iterable

MERGE_BATCH = 16  # mkl_kernel.cuh MERGE_BATCH: the chunk partials weighed per pass of the merge


def function_part(label: str) -> str:
    """The function a listing's label names: a kernel's `.text.KERNEL`, a device function's last `$`
    part of `$KERNEL$FUNC`, and of `$KERNEL$FUNC$N` too: ptxas' N-th copy of FUNC (the harness build,
    -split-compile=0, copies some functions; which ones is its choice per build)."""
    return re.sub(r"\$\d+$", "", label.removeprefix(".text.")).split("$")[-1]


def spills_by_function(ptxas_log: str) -> dict[str, tuple[int, int]]:
    """{function: (spill store bytes, spill load bytes)} from a ptxas -v log: each kernel body, and each
    device function at the worst of its copies (ptxas names both kernels' instances alike, and a copy
    of its own `NAME$N`: which function gets one moves between builds and checkouts, so a copy's
    number names no particular code)."""
    out: dict[str, tuple[int, int]] = {}
    for m in re.finditer(r"Function properties for (\S+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads", ptxas_log):
        name = re.sub(r"\$\d+$", "", m.group(1))
        old = out.get(name, (0, 0))
        out[name] = (max(old[0], int(m.group(2))), max(old[1], int(m.group(3))))
    return out


TRIPWIRE_BODY = "mkl_megakernelILb1E"  # the kernel instance with the tripwire compiled in


def spills_grown(base: dict[str, tuple[int, int]], step: dict[str, tuple[int, int]]) -> dict[str, tuple]:
    """{function: (base's, step's)} for each function of `base` whose spill stores or loads grew in
    `step` (spills_by_function's tables; every function of `base` must be in `step`). The tripwire
    instance's body is left out: ptxas compiles both kernel instances in one module, so its spills move
    with any change to either (when the marks began reading %tid.x, step 10's went from 484 / 1604 to
    416 / 1260 B and steps (i) and (j), untouched otherwise, then stored 12-24 B more than it); it is
    judged against its own build's plain body instead (test_tripwire_watch.py)."""
    return {k: (base[k], step[k]) for k in base
            if TRIPWIRE_BODY not in k and (step[k][0] > base[k][0] or step[k][1] > base[k][1])}

def assert_spills_no_more_than(base_log: str, step_log: str) -> None:
    """Every function of the base build's ptxas -v log spills no more in the step's (spills_grown: the
    tripwire body left out), the plain kernel body among them, and the step's build has every function."""
    base, step = spills_by_function(base_log), spills_by_function(step_log)
    assert any("mkl_megakernelILb0E" in k for k in base), sorted(base)
    assert set(base) <= set(step), sorted(set(base) - set(step))
    worse = spills_grown(base, step)
    assert not worse, worse


def function_listings(listing: str, names: Iterable[str]) -> dict[str, str]:
    """{name: its lines} for each of `names` that a function of the listing is named by: a label
    line other than a local `.L` one opens a function (`.text.KERNEL:` a kernel, `$KERNEL$FUNC:`
    a device function inside it, `$KERNEL$FUNC$N:` ptxas' N-th copy of it), kept under the first of
    `names` that its symbol's function part (function_part) contains, or skipped."""
    names = list(names)
    funcs: dict[str, str] = {}
    name = None
    for line in listing.splitlines():
        label = re.match(r"^(\S+):\s*$", line)
        if label and not line.startswith(".L"):
            symbol = function_part(label.group(1))
            name = next((n for n in names if n in symbol), None)
            if name:
                funcs.setdefault(name, "")
        elif name:
            funcs[name] += line + "\n"
    return funcs


def function_instances(listing: str, name: str) -> list[str]:
    """The lines of every function of the listing whose symbol's function part contains `name`, one
    string per instance (function_listings joins the instances of both kernels and shapes)."""
    out: list[str] = []
    inside = False
    for line in listing.splitlines():
        label = re.match(r"^(\S+):\s*$", line)
        if label and not line.startswith(".L"):
            inside = name in function_part(label.group(1))
            if inside:
                out.append("")
        elif inside:
            out[-1] += line + "\n"
    return out


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


def loop_bodies(sass: str) -> list[list[str]]:
    """The lines of every loop body of a listing: a backward branch's target up to the branch."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, l in enumerate(lines) if (m := re.match(r"^(\.L\w+):", l.strip()))}
    bodies = []
    for at, l in enumerate(lines):
        m = re.search(r"\bBRA\b.*`\((\.L\w+)\)", l)
        start = labels.get(m.group(1)) if m else None
        if start is not None and start < at:
            bodies.append(lines[start:at])
    return bodies


def loop_loads_then_reduces(sass: str, load: str) -> bool:
    """Does a loop body (a backward branch's target up to the branch) hold a load matching `load`
    followed by a shuffle, i.e. does each pass wait for its loads, reduce across the warp and only
    then load again (one dependent round trip a pass)?"""
    for body in loop_bodies(sass):
        first_load = next((i for i, b in enumerate(body) if re.search(load, b)), None)
        if first_load is not None and any(re.search(r"\bSHFL\b", b) for b in body[first_load:]):
            return True
    return False
