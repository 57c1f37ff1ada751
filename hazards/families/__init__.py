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
