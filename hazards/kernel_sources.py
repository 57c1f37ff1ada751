"""Where the kernel sources are: the one place that knows.

The repository's top-level `standalone/` folder (kernels, the harness, the tripwire headers
users include) ships in the wheel as package data under `hazards/standalone/` (a setuptools
`package-dir` mapping, like the engine's). An installed package finds it through
`importlib.resources`; a source checkout (editable install or none) has no
`hazards/standalone/` and uses the sibling folder `standalone/`, exactly as
`hazards/__init__.py` maps the engine. Nothing here ever depends on the current folder.
"""
from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

from hazards.engine.errors import UserError


@functools.lru_cache(maxsize=None)
def standalone_dir() -> Path:
    """The kernel source tree (`standalone/` of the checkout, or the installed package data)."""
    installed = importlib.resources.files("hazards").joinpath("standalone")
    if installed.is_dir():
        return Path(str(installed))
    checkout = Path(str(importlib.resources.files("hazards"))).parent / "standalone"
    if checkout.is_dir():
        return checkout
    raise UserError("the kernel sources are missing: neither the installed package data "
                    f"({installed}) nor a checkout's {checkout} exists; reinstall gpu-hazards")


def family_dir(folder: str) -> Path:
    """`standalone/<folder>/`: one family's kernel folder."""
    return standalone_dir() / folder


def include_dir() -> Path:
    """The headers a user's own kernels include (`-I` this for `hz_tripwire.h`)."""
    return standalone_dir() / "include"
