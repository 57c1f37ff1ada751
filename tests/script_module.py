"""A repository script (bench/, ci/gpu/) as a module, for the CPU tests of its functions."""
from __future__ import annotations

import importlib.util
import types
from pathlib import Path


def load_script(path: Path, name: str | None = None) -> types.ModuleType:
    """The script at `path` imported as module `name` (default: its stem); its
    `if __name__ == "__main__":` part does not run."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
