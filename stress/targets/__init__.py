"""Targets: things that can be run and judged. One `run()` is one RunResult.

Every target subclasses `Target`. `CommandTarget` runs a program once per run;
`ServerTarget` keeps a warm server process and sends it one request per run
(docs/protocol.md). Targets that wrap another target subclass `WrapperTarget`:
`TripwireTarget` (tripwire diagnoses), `SanitizerTarget` (compute-sanitizer reports),
`ReproTarget` (kernel-log Xid lines and evidence.json for `hazards repro`).
"""
from ..targets.base import Target, WrapperTarget
from ..targets.command import CommandTarget
from ..targets.server import ServerTarget

__all__ = ["Target", "WrapperTarget", "CommandTarget", "ServerTarget"]
