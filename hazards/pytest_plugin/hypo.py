"""Hypothesis profiles in pytest: `ci` / `nightly`, chosen by option or $HZ_HYPOTHESIS_PROFILE.

The profiles are registered in a `tryfirst` pytest_configure, before hypothesis' own
pytest plugin reads `--hypothesis-profile` in its pytest_configure. When that option is
not given, $HZ_HYPOTHESIS_PROFILE selects the profile (the option wins). Like
hypothesis' plugin, this one imports hypothesis only when it is used: a session without
hypothesis tests does not pay for the import.
"""
from __future__ import annotations

import sys

import pytest

from hazards import hypothesis_profiles
from hazards.hypothesis_profiles import PROFILE_ENV, profile_from_env

_SOURCE_KEY = pytest.StashKey[str]()


def _register() -> None:
    hypothesis_profiles.register_profiles()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    try:
        given = config.getoption("--hypothesis-profile")
    except ValueError:  # hypothesis' pytest plugin disabled (-p no:hypothesispytest)
        given = None
    name = profile_from_env()
    if given or name or "hypothesis" in sys.modules:
        _register()
    if given:
        config.stash[_SOURCE_KEY] = "--hypothesis-profile"
        return
    if name is None:
        return
    try:
        hypothesis_profiles.load(name)
    except Exception as e:  # UserError: one clear line instead of a traceback
        raise pytest.UsageError(str(e)) from None
    config.stash[_SOURCE_KEY] = f"${PROFILE_ENV}"


def pytest_collection_modifyitems() -> None:
    # Test modules imported hypothesis: make `settings.load_profile("ci")` work in them.
    if "hypothesis" in sys.modules:
        _register()


def pytest_report_header(config: pytest.Config) -> str | None:
    source = config.stash.get(_SOURCE_KEY, None)
    if source is None:
        return None
    from hypothesis import settings

    return f"hazards: hypothesis profile {settings.get_current_profile_name()!r} (from {source})"
