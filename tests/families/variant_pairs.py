"""What two variants of one family differ in: the stress variants added for `hazards mutate`
(a skew, a jitter) must be their fixed twin's point with only that timing knob changed."""
from __future__ import annotations

from typing import Any


def differing_params(family: str, a: str, b: str) -> dict[str, tuple[Any, Any]]:
    """{param: (value in a, value in b)} for every parameter the two variants resolve differently."""
    from hazards.families import get_family

    fam = get_family(family)
    pa, pb = fam.resolve({"variant": a}), fam.resolve({"variant": b})
    return {k: (pa[k], pb[k]) for k in pa if k != "variant" and pa[k] != pb[k]}
