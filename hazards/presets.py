"""How a family binary resolves a request's parameters, mirrored in Python.

The harness (standalone/common/harness.h) resolves every request as *declared defaults
<- the named variant's preset <- explicit request fields*; static models must judge the
same point, so they resolve with this function. `variant` and `seed` are the harness's
own keys and are not parameters.
"""
from __future__ import annotations

from typing import Any, Iterable

from hazards.family import Variant

HARNESS_KEYS = ("variant", "seed")


def resolve(defaults: dict[str, Any], variants: Iterable[Variant], params: dict[str, Any]) -> dict[str, Any]:
    """The full parameter point a request `params` runs (default variant: the first)."""
    variants = list(variants)
    out = dict(defaults)
    name = params.get("variant", variants[0].name if variants else None)
    for v in variants:
        if v.name == name:
            out.update(v.params)
            break
    out.update({k: v for k, v in params.items() if k not in HARNESS_KEYS})
    return out
