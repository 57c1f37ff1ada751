"""Targets: things that can be run and judged. One `run()` is one RunResult.

`CommandTarget` runs a program once per run; `ServerTarget` keeps a warm server process
and sends it one request per run (docs/protocol.md).
"""
from hazards.engine.targets.base import Target
from hazards.engine.targets.command import CommandTarget
from hazards.engine.targets.server import ServerTarget

__all__ = ["Target", "CommandTarget", "ServerTarget"]
