"""What pytest loads in every session: the plugin's options and ini switch, nothing more unasked.

The `pytest11` entry point named `hazards`, loaded once gpu-hazards is installed. An installed
package must not change other projects' test sessions: no GPU lease, no CUDA_VISIBLE_DEVICES,
no markers, no hypothesis profiles unless asked. More in docs/pytest-plugin.md.
"""
from __future__ import annotations

import argparse
from typing import Any

import pytest

PARTS = (
    "hazards.pytest_plugin.gpu",
    "hazards.pytest_plugin.repeat",
    "hazards.pytest_plugin.isolation",
    "hazards.pytest_plugin.hypo",
    "hazards.pytest_plugin.family",
)
# `-p` names that ask for the plugin: the entry point's name and the package's module.
PLUGIN_NAMES = ("hazards", "hazards.pytest_plugin")
INI_SWITCH = "hazards"
DEFAULT_POINT_RUNS = 10
DEFAULT_CONF = 0.95

_GIVEN_DEST = "hz_option_given"  # set by the action of any --hz-* option: the first one given
_ACTIVE = pytest.StashKey[str]()


class _HzStore(argparse.Action):
    """`store`, and remember that an --hz-* option was given (an opt-in)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        if not getattr(namespace, _GIVEN_DEST, None):
            setattr(namespace, _GIVEN_DEST, option_string)


class _HzFlag(_HzStore):
    """`store_true`, and remember that an --hz-* option was given (an opt-in)."""

    def __init__(self, option_strings: list[str], dest: str, default: bool = False, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, **kwargs)

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, True, option_string)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hazards", "gpu-hazards (any --hz-* option turns the plugin on)")
    group.addoption("--hz-repeat", action=_HzStore, type=int, default=None, metavar="N",
                    help="run each test N times and report its failure rate with a confidence interval")
    group.addoption("--hz-fail-on-flaky", action=_HzFlag,
                    help="fail the session when a test both passed and failed (flaky)")
    group.addoption("--hz-conf", action=_HzStore, type=float, default=DEFAULT_CONF, metavar="C",
                    help=f"confidence level of the failure-rate intervals (default {DEFAULT_CONF})")
    group.addoption("--hz-no-lease", action=_HzFlag,
                    help="do not lease a GPU; use CUDA_VISIBLE_DEVICES as given")
    group.addoption("--hz-lease-wait", action=_HzStore, type=float, default=0.0, metavar="S",
                    help="wait up to S seconds for a free GPU lease (default 0)")
    group.addoption("--hz-point-runs", action=_HzStore, type=int, default=DEFAULT_POINT_RUNS, metavar="R",
                    help=f"re-run a failing family point R times to report its rate (default {DEFAULT_POINT_RUNS}; 0: off)")
    parser.addini(INI_SWITCH, type="bool", default=False,
                  help="turn the gpu-hazards plugin on for this project (GPU lease, hz_gpu marker, "
                       "hz_timeout, failure rates, hypothesis profiles)")


def opt_in_reason(config: pytest.Config) -> str | None:
    """Why this session uses the plugin (`-p hazards`, `hazards = true`, `--hz-repeat`), or
    None when it did not ask for it."""
    namespaces = [ns for ns in (getattr(config, "known_args_namespace", None), config.option) if ns is not None]
    for ns in namespaces:
        for name in getattr(ns, "plugins", None) or ():
            if name in PLUGIN_NAMES:
                return f"-p {name}"
    if config.pluginmanager.get_plugin("hazards.pytest_plugin") is not None:
        return "hazards.pytest_plugin loaded by pytest_plugins"
    for ns in namespaces:
        if getattr(ns, _GIVEN_DEST, None):
            return f"{getattr(ns, _GIVEN_DEST)} given"
    try:
        if config.getini(INI_SWITCH):
            return f"{INI_SWITCH} = true in {config.inipath.name if config.inipath else 'the pytest configuration'}"
    except ValueError:  # the ini option is not registered (this module loaded under another name)
        pass
    return None


def is_active(config: pytest.Config) -> bool:
    """True when the session opted in and the plugin's parts are registered."""
    return config.stash.get(_ACTIVE, None) is not None


def activate(config: pytest.Config, reason: str) -> None:
    """Register the plugin's parts (idempotent). A part blocked with `-p no:<module>` stays off."""
    if is_active(config):
        return
    config.stash[_ACTIVE] = reason
    for name in PARTS:
        config.pluginmanager.import_plugin(name)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    reason = opt_in_reason(early_config)
    if reason is None:
        return
    activate(early_config, reason)
    if early_config.pluginmanager.has_plugin("hazards.pytest_plugin.gpu"):
        # The parts were registered during this hook call, which does not reach them: take
        # the lease here, before conftests and test modules (and any CUDA library) load.
        from hazards.pytest_plugin.gpu import lease_for_session

        lease_for_session(early_config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Opted in too late for the early hook (a conftest's `pytest_plugins`), or an in-process
    # session that skipped it: the parts' own pytest_configure (historic) takes the lease.
    reason = opt_in_reason(config)
    if reason is not None:
        activate(config, reason)


# What a test can use only with the plugin on: without it the markers are silently inert and
# the fixtures "not found". A test that uses one in a session that did not opt in is told so.
PLUGIN_MARKERS = ("hz_gpu", "hz_timeout")
PLUGIN_FIXTURES = ("hz_gpu", "hz_family_server", "hz_run_out_of_process")
OPT_IN_HINT = ("the gpu-hazards pytest plugin is opt-in: turn it on with `-p hazards` (or `hazards = true` "
               "in [tool.pytest.ini_options], or any --hz-* option)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """One line, not an error: the session goes on as it would have (a marker stays inert, a
    fixture is still "not found"), now saying why."""
    if is_active(config):
        return
    users: list[tuple[str, str]] = []
    for item in items:
        used = [f"@pytest.mark.{m}" for m in PLUGIN_MARKERS if item.get_closest_marker(m) is not None]
        used += [f"fixture {f}" for f in PLUGIN_FIXTURES if f in getattr(item, "fixturenames", ())]
        if used:
            users.append((item.nodeid, used[0]))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if users and reporter is not None:
        first, what = users[0]
        more = f" and {len(users) - 1} more" if len(users) > 1 else ""
        reporter.write_line(f"hazards: {first} uses {what}{more}, but {OPT_IN_HINT}", yellow=True)


def pytest_report_header(config: pytest.Config) -> str | None:
    reason = config.stash.get(_ACTIVE, None)
    return f"hazards: plugin on ({reason})" if reason else None
