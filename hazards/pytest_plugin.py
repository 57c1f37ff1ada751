"""pytest plugin (entry point `pytest11`): the `gpu` marker.

Tests marked `@pytest.mark.gpu` are skipped with a clear reason when no NVIDIA GPU is
usable. GPU detection uses NVML / nvidia-smi and never initialises CUDA in pytest's process.
"""
from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a usable NVIDIA GPU (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from stress.gpus import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no usable NVIDIA GPU (NVML/nvidia-smi found none, or CUDA_VISIBLE_DEVICES is empty)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
