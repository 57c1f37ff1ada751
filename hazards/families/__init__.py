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


def named_items(spec: str, variants: dict[str, list[str]],
                also: tuple[str, ...] = ()) -> set[tuple[str, str | None]]:
    """What a `NAME,...` list names (empty names left out), as (family, variant) pairs of
    `variants` (a family's name -> its variants' names): a family names each of its variants,
    FAMILY/VARIANT one; a name of `also` is (name, None). A one-line UserError names those that
    are none of these: a mistyped name would build or measure nothing and say nothing (ci/gpu's
    round.sh and stall_measure.py select with these pairs, matching no name again)."""
    from hazards.engine.errors import UserError

    meaning: dict[str, set[tuple[str, str | None]]] = {name: {(name, None)} for name in also}
    for fam, names in variants.items():
        meaning[fam] = {(fam, v) for v in names}
        meaning.update({f"{fam}/{v}": {(fam, v)} for v in names})
    named = {n for n in spec.split(",") if n}
    unknown = sorted(named - meaning.keys())
    if unknown:
        kinds = ["family", "FAMILY/VARIANT", *also]
        raise UserError(f"{', '.join(unknown)}: no such {', '.join(kinds[:-1])} or {kinds[-1]}")
    return set().union(*(meaning[n] for n in named))
