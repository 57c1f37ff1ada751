"""Optional dependencies: the extra that brings each module, and the one-line install hint.

`pip install gpu-hazards` installs the core (the CLI, the engine, the static checks, the
pytest plugin's logic); the extras of pyproject.toml's [project.optional-dependencies]
bring what only some users need. `EXTRA_MODULES` names the import names the code needs
from each extra (tests/test_packaging.py checks it against pyproject.toml). Tools that are
executables rather than imports (py-spy: `forensics`; nvdisasm/cuobjdump: `nvtools`) are
looked up where they are used and say the same thing when absent.
"""
from __future__ import annotations

import importlib

from .errors import UserError

PACKAGE = "gpu-hazards"
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "reports": ("jinja2", "matplotlib"),  # the HTML report of `hazards report` / `hazards soak`
    "torch": ("torch",),  # the reference megakernels' Python side (their numpy comes with scipy, a core dependency)
    "ray": ("ray",),  # `hazards soak --executor ray`
    "xdist": ("xdist",),  # `pytest -n N`: one GPU lease per worker
}


class MissingExtra(UserError):
    """A code path needs an optional dependency that is not installed."""


def install_hint(extra: str) -> str:
    """The command that installs one extra."""
    return f"pip install '{PACKAGE}[{extra}]'"


def extra_of(module: str) -> str | None:
    """The extra that brings `module` (a top-level import name), or None for the core."""
    top = module.split(".")[0]
    return next((extra for extra, modules in EXTRA_MODULES.items() if top in modules), None)


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def require(extra: str, needed_for: str) -> None:
    """Raise MissingExtra (one line, with the install command) unless every module of
    `extra` imports. Call it before doing anything that the missing module would undo
    (a soak checks at its start, not after its budget)."""
    missing = [m for m in EXTRA_MODULES[extra] if not _importable(m)]
    if missing:
        raise MissingExtra(f"{needed_for} needs {' and '.join(missing)}, which is not installed: "
                           f"{install_hint(extra)}")


def missing_extra_error(exc: ImportError, doing: str) -> MissingExtra | None:
    """The one-line error for an ImportError of an optional module (None for any other)."""
    name = getattr(exc, "name", None) or ""
    extra = extra_of(name) if name else None
    if extra is None:
        return None
    return MissingExtra(f"{doing} needs {name.split('.')[0]}, which is not installed: {install_hint(extra)}")
