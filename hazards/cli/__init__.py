"""The `hazards` command line.

Each subcommand lives in its own module in this package (named after it) and registers
itself on `hazards.cli.app.app`; this module imports every sibling module, so adding a
command is adding a file. What several commands share (options, value parsers) lives in
`hazards.cli.options`. `main()` turns expected failures (`hazards.engine.errors.UserError` and friends)
into one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys

from hazards.cli.app import app

_LOADED = False
_NOT_COMMANDS = ("app", "options")  # what the commands share, not commands themselves


def load_commands() -> None:
    """Import every command module in this package (idempotent)."""
    global _LOADED
    if _LOADED:
        return
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name not in _NOT_COMMANDS and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    _LOADED = True


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    from hazards.engine.errors import UserError

    load_commands()
    try:
        rv = app(args=argv, prog_name="hazards", standalone_mode=False)
    except UserError as e:
        print(f"hazards: error: {e}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:  # typer.Exit / click's exit
        return int(e.code or 0)
    except KeyboardInterrupt:
        print("hazards: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        # click's exceptions and typer>=0.29's vendored copies (typer._click) alike
        show, code = getattr(e, "show", None), getattr(e, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            return code
        if type(e).__name__ == "Abort":
            return 1
        raise
    # click returns the exit code of typer.Exit in non-standalone mode
    return rv if isinstance(rv, int) else 0
