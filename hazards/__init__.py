"""The hazard catalog (families, strategies, oracles, static checkers) and the `hazards` CLI.

The engine lives in the repository's top-level `stress/` folder and is installed as
`hazards.engine` (a setuptools `package-dir` mapping), so no top-level `stress` import name
ever shadows a user's own package. The engine never imports the rest of `hazards`.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

# `pytest -p hazards` without the package installed imports this package as the plugin
# (installed, the `hazards` entry point answers instead): load the real one from here.
pytest_plugins = ["hazards.pytest_plugin"]


def _load_engine_from_checkout() -> None:
    """In a source checkout (editable install or none), `hazards/engine/` does not exist:
    the engine is the sibling folder `stress/`. Register it as `hazards.engine` so that one
    import name works whether the package is installed, installed editable, or not at all.
    An installed wheel has a real `hazards/engine/` package and skips this."""
    here = Path(__file__).resolve().parent
    if (here / "engine").is_dir() or "hazards.engine" in sys.modules:
        return
    engine_dir = here.parent / "stress"
    if not (engine_dir / "__init__.py").is_file():
        return
    spec = importlib.util.spec_from_file_location(
        "hazards.engine", engine_dir / "__init__.py", submodule_search_locations=[str(engine_dir)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hazards.engine"] = module
    globals()["engine"] = module  # what the import system does for a found submodule
    spec.loader.exec_module(module)


_load_engine_from_checkout()
