"""The gpu-hazards pytest plugin. Opt-in: it acts only in a session that asks for it.

Installed, pytest loads `hazards.pytest_plugin.entry_point` (the `pytest11` entry point
`hazards`) in every session; it adds the `--hz-*` options and the `hazards` ini switch and
does nothing else until the session opts in with `-p hazards`, `hazards = true` in the
pytest configuration, or any `--hz-*` option. Then it registers the parts:

- `gpu`: the `hz_gpu` marker (skip with a reason when no GPU is usable), one exclusive GPU
  lease per pytest process / xdist worker with CUDA_VISIBLE_DEVICES set before any CUDA
  use, and the `hz_gpu` fixture.
- `repeat`: `--hz-repeat N` (or pytest-repeat / pytest-flakefinder repetitions), the
  failure-rate summary with exact confidence intervals, flaky detection and
  `--hz-fail-on-flaky`.
- `isolation`: the `hz_timeout(s)` marker and the `hz_run_out_of_process` fixture: the GPU
  body runs in a supervised child that the engine's watchdog kills on a hang.
- `hypo`: the hypothesis profiles (`hazards-ci`, `hazards-nightly`, $HZ_HYPOTHESIS_PROFILE), and for a
  failing family point the failing parameters, the rate re-measured at that point and
  the `hazards repro` command that replays it.
- `family`: the `hz_family_server` fixture.

`-p hazards.pytest_plugin` (this module) opts in too, installed or not: registering this
module registers the entry-point module if pytest has not (package not installed), under
the entry point's name when that is free, so the two never collide.
"""
from __future__ import annotations


def pytest_addoption(parser, pluginmanager) -> None:  # noqa: ARG001 (pytest passes both)
    # Called when this module is registered (pytest_addoption is historic): make sure the
    # options and the opt-in logic are there, exactly once.
    from hazards.pytest_plugin import entry_point

    if pluginmanager.is_registered(entry_point):
        return
    free = pluginmanager.get_plugin("hazards") is None and not pluginmanager.is_blocked("hazards")
    pluginmanager.register(entry_point, "hazards" if free else entry_point.__name__)
