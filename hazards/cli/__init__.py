"""The `hazards` command line.

Each subcommand lives in its own module in this package (named after it) and registers
itself on `hazards.cli.app.app`; this module imports every sibling module, so adding a
command is adding a file. What several commands share (options, value parsers) lives in
`hazards.cli.options`. `main()` turns expected failures (`hazards.engine.errors.UserError` and friends)
into one line on stderr and a non-zero exit, never a traceback; SIGTERM, SIGHUP and SIGQUIT
end every command like Ctrl-C (exit 128 + the signal's number). Run as the `hazards`
command, the process also becomes a supervisor for good before its first child
(`hazards.engine.containment`: child subreaper, a guardian that cleans up if it dies).
"""
from __future__ import annotations

import importlib
import pkgutil
import sys

from hazards.cli.app import app

_LOADED = False
_NOT_COMMANDS = ("app", "options", "project_defaults")  # what the commands share, not commands themselves


def load_commands() -> None:
    """Import every command module in this package (idempotent)."""
    global _LOADED
    if _LOADED:
        return
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name not in _NOT_COMMANDS and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    _LOADED = True


def _say_interrupted() -> None:
    try:
        print("hazards: interrupted", file=sys.stderr)
    except OSError:  # the terminal hung up (SIGHUP)
        pass


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    from hazards.engine.errors import UserError

    from hazards.cli.options import interrupt_exit_code, stop_signals_as_interrupt
    from hazards.engine.containment import CONTAINMENT

    load_commands()
    if argv is None:  # this process is the `hazards` command: a supervisor for good
        CONTAINMENT.supervise_when_spawning()
    stopped: dict[str, int] = {}
    try:
        with stop_signals_as_interrupt() as stopped:
            rv = app(args=argv, prog_name="hazards", standalone_mode=False)
        if "signum" in stopped:  # typer made the interrupt exit code 130: say which signal
            _say_interrupted()
            return 128 + stopped["signum"]
    except UserError as e:
        print(f"hazards: error: {e}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:  # typer.Exit / click's exit
        return int(e.code or 0)
    except KeyboardInterrupt as e:  # Ctrl-C, or a stop signal (SIGTERM, SIGHUP, SIGQUIT)
        _say_interrupted()
        return interrupt_exit_code(e)
    except ImportError as e:
        # An optional dependency that a code path needs and no earlier check caught: the
        # extra that brings it, in one line (any other ImportError is a bug: traceback).
        from hazards.engine.extras import missing_extra_error

        words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
        err = missing_extra_error(e, " ".join(["hazards", *words[:1]]))
        if err is None:
            raise
        print(f"hazards: error: {err}", file=sys.stderr)
        return err.exit_code
    except Exception as e:
        # click's exceptions and typer>=0.29's vendored copies (typer._click) alike
        show, code = getattr(e, "show", None), getattr(e, "exit_code", None)
        if callable(show) and isinstance(code, int):
            message, ctx = getattr(e, "format_message", None), getattr(e, "ctx", None)
            if not callable(message):
                show()
                return code
            # Bad input is one line like every other (click's own is a usage block of three).
            where = f" (see '{ctx.command_path} --help')" if ctx is not None and code == 2 else ""
            print(f"hazards: error: {' '.join(str(message()).split())}{where}", file=sys.stderr)
            return code
        if type(e).__name__ == "Abort":
            return 1
        raise
    # click returns the exit code of typer.Exit in non-standalone mode
    return rv if isinstance(rv, int) else 0
