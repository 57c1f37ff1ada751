"""The gpu-hazards pytest plugin (entry point `pytest11`: `hazards.pytest_plugin`).

Each part lives in its own module, loaded together through `pytest_plugins`:

- `gpu`: the `gpu` marker (skip with a reason when no GPU is usable), one exclusive GPU
  lease per pytest process / xdist worker with CUDA_VISIBLE_DEVICES set before any CUDA
  use, and the `hz_gpu` fixture.
- `repeat`: `--hz-repeat N`, the failure-rate summary with exact confidence intervals,
  flaky detection and `--hz-fail-on-flaky`.
- `isolation`: the `hz_timeout(s)` marker and the `hz_run_out_of_process` fixture: the GPU
  body runs in a supervised child that the engine's watchdog kills on a hang.
- `hypo`: the hypothesis profiles (`ci`, `nightly`, $HZ_HYPOTHESIS_PROFILE), and for a
  failing family point the failing parameters, the rate re-measured at that point and
  the `hazards repro` command that replays it.
- `family`: the `hz_family_server` and `hz_family_probe` fixtures.

Loading it without installing the package: `python3 -m pytest -p hazards.pytest_plugin`.
"""
from __future__ import annotations

pytest_plugins = [
    "hazards.pytest_plugin.gpu",
    "hazards.pytest_plugin.repeat",
    "hazards.pytest_plugin.isolation",
    "hazards.pytest_plugin.hypo",
    "hazards.pytest_plugin.family",
]
