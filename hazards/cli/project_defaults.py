"""A project's own defaults: `[tool.hazards]` in the nearest pyproject.toml.

    [tool.hazards]
    budget = "2m"                  # every command that has --budget
    families = ["pipeline", "deadlock"]
    skip = ["nvdisasm"]
    store = ".hazards/ci.db"       # relative to the pyproject.toml's folder
More in docs/cli.md.
"""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from hazards.engine.errors import UserError

# Key -> the option's parameter name in the commands' signatures.
KEYS = {"budget": "budget", "families": "families", "skip": "skip", "store": "store_path"}
LIST_KEYS = ("families", "skip")


def find_pyproject(start: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The nearest pyproject.toml at or above `start` (default: the current folder) that has a
    [tool.hazards] table, with that table; None when there is none. A pyproject.toml that is
    not valid TOML is a UserError naming it."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        path = folder / "pyproject.toml"
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as e:
            raise UserError(f"{path}: not a readable TOML file ({e}); fix it or run from another folder") from None
        table = data.get("tool", {}).get("hazards")
        if table is not None:
            if not isinstance(table, dict):
                raise UserError(f"{path}: [tool.hazards] must be a table")
            return path, table
    return None


def _value(path: Path, where: str, key: str, value: Any) -> Any:
    if key not in KEYS:
        raise UserError(f"{path}: unknown key {key!r} in {where}; known: {', '.join(KEYS)}")
    if key in LIST_KEYS:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
            raise UserError(f"{path}: {where}.{key} must be a name or a list of names, got {value!r}")
        return items
    if not isinstance(value, str) or not value:
        raise UserError(f"{path}: {where}.{key} must be a non-empty string, got {value!r}")
    return str((path.parent / value)) if key == "store" else value


def _chosen(command: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The values `command` has options for; for a group (`hazards store`, `hazards gate`),
    nested per subcommand, as click looks a subcommand's defaults up in its group's map."""
    subcommands = getattr(command, "commands", None)
    if subcommands:
        nested = {sub: _chosen(c, values) for sub, c in subcommands.items()}
        return {sub: m for sub, m in nested.items() if m}
    params = {p.name for p in getattr(command, "params", ())}
    return {KEYS[k]: v for k, v in values.items() if KEYS[k] in params}


def default_map(commands: dict[str, Any], start: Path | None = None) -> dict[str, dict[str, Any]]:
    """click's default_map for `commands` (name -> click command): for each command, the
    file's values for the options it has (its own table over the shared one)."""
    found = find_pyproject(start)
    if found is None:
        return {}
    path, table = found
    shared = {k: _value(path, "[tool.hazards]", k, v) for k, v in table.items() if not isinstance(v, dict)}
    result: dict[str, dict[str, Any]] = {}
    for name, command in commands.items():
        own = table.get(name, {})
        if not isinstance(own, dict):
            own = {}
        values = {**shared, **{k: _value(path, f"[tool.hazards.{name}]", k, v) for k, v in own.items()}}
        chosen = _chosen(command, values)
        if chosen:
            result[name] = chosen
    unknown = [k for k, v in table.items() if isinstance(v, dict) and k not in commands]
    if unknown:
        raise UserError(f"{path}: [tool.hazards.{unknown[0]}] names no command; commands: {', '.join(sorted(commands))}")
    return result
