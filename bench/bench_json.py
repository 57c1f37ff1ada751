"""The `--json PATH` output every bench script offers: one writer, one format."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save_json(path: Path | str | None, result: Any) -> None:
    """Write `result` to `path` as indented JSON, if a path was given (`--json` is optional)."""
    if path:
        Path(path).write_text(json.dumps(result, indent=1))
