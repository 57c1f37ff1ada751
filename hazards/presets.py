"""How a family binary resolves a request's parameters, mirrored in Python.

The harness (standalone/common/harness.h) resolves every request as *declared defaults
<- the named variant's preset <- explicit request fields*; static models must judge the
same point, so they resolve with this function. `variant` and `seed` are the harness's
own keys and are not parameters.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

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


class Points:
    """A static family's parameter points: defaults, presets (one per variant) and the -D
    define name of every parameter. A request is `{"variant": name, **overrides}`."""

    def __init__(self, defaults: Mapping[str, Any], variants: Sequence[Variant],
                 define_names: Mapping[str, str]) -> None:
        self.defaults = dict(defaults)
        self.by_name = {v.name: v for v in variants}
        self.define_names = dict(define_names)

    def resolve(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults <- the named variant's preset <- explicit fields."""
        out = dict(self.defaults)
        name = params.get("variant")
        if name in self.by_name:
            out.update(self.by_name[name].params)
        out.update({k: v for k, v in params.items() if k != "variant"})
        return out

    def defines(self, params: Mapping[str, Any]) -> dict[str, int]:
        """The -D parameters that build this point."""
        p = self.resolve(params)
        return {self.define_names[k]: int(p[k]) for k in self.define_names}

    def label(self, prefix: str, params: Mapping[str, Any]) -> str:
        """A build label naming every define (readable file names in the build cache)."""
        return prefix + "-" + "-".join(f"{k}{v}" for k, v in sorted(self.defines(params).items()))
