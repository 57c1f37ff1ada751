"""Parameter points of the static families: defaults <- variant preset <- overrides.

A static family is built from one source with -D parameters; `Points` resolves a request
(`{"variant": name, **overrides}`) to the full parameter set, the -D defines that build it,
and a stable label for the build cache.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from hazards.family import Variant


class Points:
    """Defaults, presets (one per variant) and the define name of every parameter."""

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
        """A build label naming every define (readable file names in build/static/)."""
        return prefix + "-" + "-".join(f"{k}{v}" for k, v in sorted(self.defines(params).items()))
