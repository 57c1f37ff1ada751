"""Errors that mean "the user asked for something we cannot do", and the exit codes.

The CLI prints these as one line and exits non-zero; nothing that raises one may have
written to the results store first (except `StoreError`, which says where the finished
runs went). The `EXIT_*` constants are the exit codes every command uses (the table
is in docs/cli.md).
"""

import math
from typing import Any

EXIT_OK = 0             # clean / passed
EXIT_HAZARD = 1         # a hazard observed, a regression, a canary that went blind
EXIT_BAD_INPUT = 2      # bad input: one line on stderr, nothing written
EXIT_NOT_JUDGED = 3     # something could not be judged (only errors, missing toolchain, no GPU)
EXIT_STORE = 4          # the results store failed (damaged, disk full, I/O error)
EXIT_DEGRADED = 5       # the infrastructure degraded mid-campaign (a soak lost a node), nothing else flagged
# 128 + N: stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP; hazards.cli.options)


class UserError(Exception):
    """Bad input: a malformed spec, a missing toolchain, a target that does not exist."""

    exit_code = EXIT_BAD_INPUT


class NotJudged(UserError):
    """Nothing could be judged here: no usable GPU, a server that died before its handshake."""

    exit_code = EXIT_NOT_JUDGED


class ToolchainMissing(UserError):
    """A compiler or tool the request needs is not installed, or the user asked to skip it.

    `tool` is its `hazards.engine.toolchain.TOOLS` key ("" when it is not one of those);
    `skipped` is True when the user named it in `--skip` (it may well be installed)."""

    def __init__(self, message: str, *, tool: str = "", skipped: bool = False) -> None:
        super().__init__(message)
        self.tool, self.skipped = tool, skipped


class StoreError(UserError):
    """The results store could not be read or written (damaged file, full disk, I/O error,
    a write lock held too long). The message names the file and what to do."""

    exit_code = EXIT_STORE


def check_seconds(value: Any, what: str, *, allow_zero: bool = False) -> Any:
    """The one check of a number of seconds someone gave (a flag, a TOML key, an argument):
    finite and positive (>= 0 with `allow_zero`), as a float; None passes as None (not
    given). Anything else is a one-line UserError naming `what`: an infinite timeout would
    hang a campaign forever."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "a non-negative" if allow_zero else "a positive"
        shown = f"{value:g}" if isinstance(value, float) else repr(value)
        raise UserError(f"{what} must be {bound}, finite number of seconds, got {shown}")
    return seconds


class ProtocolError(Exception):
    """A server target said something that is not the protocol (garbage, truncated line)."""
