"""The reference ragged-decode megakernel (the ragged-decode contract) and its torch reference.

Submodules: `build` (nvcc -> cached shared library; no torch), `schedule` (pure-Python
model of the device-side schedule; no torch), `kernel` (ctypes contract: build_sched /
ragged_decode / teardown), `reference` (the contract's per-request loop and fixtures),
`calibration` (tolerance table). torch is imported only by the last three, and only when
they are used: importing this package imports nothing heavy.
"""
from __future__ import annotations

from typing import Any

_KERNEL_NAMES = ("build_sched", "ragged_decode", "teardown")


def __getattr__(name: str) -> Any:
    if name in _KERNEL_NAMES:
        from hazards.ragged_decode import kernel

        return getattr(kernel, name)
    raise AttributeError(name)
