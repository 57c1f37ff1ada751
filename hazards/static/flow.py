"""Control-flow helpers shared by the AMDGCN and SASS checks (instructions by index)."""
from __future__ import annotations

from typing import Iterable, Mapping


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
