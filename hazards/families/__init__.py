"""The catalog: every module here that defines `FAMILY` is a hazard family."""
from __future__ import annotations

import importlib
import pkgutil

from hazards.family import Family


def all_families() -> list[Family]:
    """Every family in the catalog, sorted by name."""
    found: list[Family] = []
    for mod in pkgutil.iter_modules(__path__):
        m = importlib.import_module(f"{__name__}.{mod.name}")
        fam = getattr(m, "FAMILY", None)
        if isinstance(fam, Family):
            found.append(fam)
    return sorted(found, key=lambda f: f.name)


def launch_server_families() -> list[str]:
    """The names of the families with a launch server (a runtime binary), sorted."""
    return [f.name for f in all_families() if f.binary]


def get_family(name: str) -> Family:
    """The family called `name`; a UserError naming the known ones otherwise."""
    from hazards.engine.errors import UserError

    fams = {f.name: f for f in all_families()}
    if name not in fams:
        raise UserError(f"no family {name!r} (known: {', '.join(sorted(fams)) or 'none'})")
    return fams[name]


def cuda_binary_families() -> list[Family]:
    """The families with a runtime binary built for CUDA (what a GPU round builds and runs)."""
    return [f for f in all_families() if f.binary and "cuda" in f.platforms]


def named_items(spec: str, variants: dict[str, list[str]], also: tuple[str, ...] = ()) -> set[str]:
    """The names of a `NAME,...` list (empty names left out), each a family of `variants` (a
    family's name -> its variants' names), FAMILY/VARIANT of one, or one of `also`; a one-line
    UserError naming those that are none of these: a mistyped name would build or measure
    nothing and say nothing (ci/gpu's round.sh and stall_measure.py parse their lists here)."""
    from hazards.engine.errors import UserError

    names = {n for n in spec.split(",") if n}
    known = {*variants, *(f"{fam}/{v}" for fam, vs in variants.items() for v in vs), *also}
    unknown = sorted(names - known)
    if unknown:
        kinds = ["family", "FAMILY/VARIANT", *also]
        raise UserError(f"{', '.join(unknown)}: no such {', '.join(kinds[:-1])} or {kinds[-1]}")
    return names
