"""Control-flow helpers shared by the AMDGCN and SASS checks (instructions by index)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping


def reaching(preds: Mapping[int, Iterable[int]], target: int) -> set[int]:
    """The instructions from which `target` can be reached, given each one's predecessors:
    what may run before it, a loop's later trips included."""
    seen: set[int] = set()
    stack = list(preds.get(target, []))
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(preds.get(i, []))
    return seen


def predecessors(func: Any, among: Iterable[int] | None = None) -> dict[int, list[int]]:
    """Each instruction's predecessors in `func` (a SASS or AMDGCN function: `instrs` and
    `successors(i)`), over the instructions `among` (default: every one, in order)."""
    preds: dict[int, list[int]] = {}
    for i in range(len(func.instrs)) if among is None else among:
        for s in func.successors(i):
            preds.setdefault(s, []).append(i)
    return preds
