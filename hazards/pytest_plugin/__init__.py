"""The gpu-hazards pytest plugin. Opt-in: it acts only in a session that asks for it.

Installed, pytest loads `hazards.pytest_plugin.entry_point` (the `pytest11` entry point
`hazards`) in every session; it adds the `--hz-*` options and the `hazards` ini switch and
does nothing else until the session opts in with `-p hazards`, `hazards = true` in the
pytest configuration, or any `--hz-*` option. More in docs/pytest-plugin.md.
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
