"""Targets: things that can be run and judged. One `run()` is one RunResult.

`CommandTarget` runs a program once per run; `ServerTarget` keeps a warm server process
and sends it one request per run (docs/protocol.md).
"""
from stress.targets.base import Target
from stress.targets.command import CommandTarget
from stress.targets.server import ServerTarget

__all__ = ["Target", "CommandTarget", "ServerTarget"]
