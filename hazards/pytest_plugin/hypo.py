"""Hypothesis profiles in pytest: `hazards-ci`, `hazards-nightly`; by option or $HZ_HYPOTHESIS_PROFILE.

The profiles are registered in a `tryfirst` pytest_configure, before hypothesis' own
pytest plugin reads `--hypothesis-profile` in its pytest_configure. When that option is
not given, $HZ_HYPOTHESIS_PROFILE selects the profile (the option wins). Like
hypothesis' plugin, this one imports hypothesis only when it is used: a session without
hypothesis tests does not pay for the import. More in docs/pytest-plugin.md.
"""
from __future__ import annotations

import sys

import pytest

from hazards import hypothesis_profiles
from hazards.hypothesis_profiles import PROFILE_ENV, profile_from_env

REPEAT_PROFILE = "hazards-repeat"
_SOURCE_KEY = pytest.StashKey[str]()
_BASE_PROFILE_KEY = pytest.StashKey[str]()  # the profile that REPEAT_PROFILE copies


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


@pytest.hookimpl(tryfirst=True)  # after every pytest_configure, before the header and collection
def pytest_sessionstart(session: pytest.Session) -> None:
    from hazards.pytest_plugin.repeat import repetition_source

    config = session.config
    if repetition_source(config) is None:
        return
    from hypothesis import settings

    base = settings.get_current_profile_name()
    if base == REPEAT_PROFILE:  # an hz_timeout child started by a repeating parent
        return
    _register()
    settings.register_profile(REPEAT_PROFILE, parent=settings.get_profile(base), database=None)
    settings.load_profile(REPEAT_PROFILE)
    config.stash[_BASE_PROFILE_KEY] = base


def profile_for_children(config: pytest.Config) -> str | None:
    """The profile a child pytest (hz_timeout) should load: the selected one (the child
    derives `hazards-repeat` itself when it repeats too), or None without hypothesis."""
    base = config.stash.get(_BASE_PROFILE_KEY, None)
    if base is not None:
        return base
    try:
        from hypothesis import settings
    except ImportError:
        return None
    return settings.get_current_profile_name()


def pytest_collection_modifyitems() -> None:
    # Test modules imported hypothesis: make `settings.load_profile("hazards-ci")` work in them.
    if "hypothesis" in sys.modules:
        _register()


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    source = config.stash.get(_SOURCE_KEY, None)
    base = config.stash.get(_BASE_PROFILE_KEY, None)
    if source is not None:
        from hypothesis import settings

        lines.append(f"hazards: hypothesis profile {base or settings.get_current_profile_name()!r} (from {source})")
    if base is not None:
        lines.append(f"hazards: hypothesis example database off while tests repeat "
                     f"(profile {REPEAT_PROFILE!r}: {base!r} without a database)")
    return lines
