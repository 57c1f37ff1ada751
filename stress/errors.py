"""Errors that mean "the user asked for something we cannot do".

The CLI prints these as one line and exits non-zero; nothing that raises one may have
written to the results store first.
"""


class UserError(Exception):
    """Bad input: a malformed spec, a missing toolchain, a target that does not exist."""

    exit_code = 2


class ToolchainMissing(UserError):
    """A compiler or tool the request needs is not installed."""


class ProtocolError(Exception):
    """A server target said something that is not the protocol (garbage, truncated line)."""
