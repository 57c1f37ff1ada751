"""Hypothesis settings profiles for hazard property tests: `hazards-ci` and `hazards-nightly`.

The names are this project's own: hypothesis itself registers a `ci` profile (loaded when it
sees a CI environment), and a user's conftest may define `ci` or `nightly`; this module never
redefines a profile it did not register. More in docs/pytest-plugin.md.
"""
from __future__ import annotations

import os
from pathlib import Path

PROFILE_ENV = "HZ_HYPOTHESIS_PROFILE"
CI_MAX_EXAMPLES = 12
NIGHTLY_MAX_EXAMPLES = 400
CI_PROFILE = "hazards-ci"
NIGHTLY_PROFILE = "hazards-nightly"
PROFILES = (CI_PROFILE, NIGHTLY_PROFILE)
# The settings objects this module registered, by name: a profile of the same name that is not
# one of these belongs to the user (or to hypothesis) and is left alone.
_REGISTERED: dict[str, object] = {}


def database_dir(store_path: str | os.PathLike[str] | None = None) -> Path:
    """The example database of a results store: the folder `hypothesis/` beside it (for the
    default store `.hazards/results.db`: `.hazards/hypothesis/`). `store_path` None means the
    store every command opens by default ($HZ_STORE, else `.hazards/results.db`)."""
    from hazards.engine.store import StoreLayout

    return StoreLayout.of(store_path).examples


def register_profiles(database_dir: str | os.PathLike[str] | None = None) -> None:
    """Register the `hazards-ci` and `hazards-nightly` profiles (idempotent: re-registering
    replaces ours, e.g. after $HZ_STORE moved; a profile of that name that someone else
    registered first is kept as it is).

    `database_dir` overrides where `nightly` keeps its example database (default: beside
    the default results store, `database_dir()`).
    hypothesis is imported here, not at module import, so importing this module is cheap.
    """
    from hypothesis import HealthCheck, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    # Both profiles: a family point can legitimately take seconds (a batch of launches),
    # and a server fixture shared across examples is the point of a warm server.
    suppressed = (HealthCheck.too_slow, HealthCheck.function_scoped_fixture)
    _register_ours(
        CI_PROFILE,
        derandomize=True,
        max_examples=CI_MAX_EXAMPLES,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=suppressed,
    )
    _register_ours(
        NIGHTLY_PROFILE,
        max_examples=NIGHTLY_MAX_EXAMPLES,
        deadline=None,
        database=DirectoryBasedExampleDatabase(str(Path(database_dir) if database_dir else _default_dir())),
        print_blob=True,
        suppress_health_check=suppressed,
    )


def _register_ours(name: str, **values: object) -> None:
    """settings.register_profile, unless a profile of this name exists that we did not register."""
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    try:
        current = settings.get_profile(name)
    except InvalidArgument:
        current = None
    if current is not None and current is not _REGISTERED.get(name):
        return  # the user's (or hypothesis') own profile of that name: never redefined
    settings.register_profile(name, **values)
    _REGISTERED[name] = settings.get_profile(name)


def _default_dir() -> Path:
    return database_dir(None)


def profile_from_env() -> str | None:
    """The profile named by $HZ_HYPOTHESIS_PROFILE, or None when it is unset or empty."""
    name = os.environ.get(PROFILE_ENV, "").strip()
    return name or None


def load_profile_from_env() -> str | None:
    """Load the profile named by $HZ_HYPOTHESIS_PROFILE (if set) and return its name.

    Raises hazards.engine.errors.UserError for a name that is not a registered profile.
    """
    name = profile_from_env()
    if name is None:
        return None
    load(name)
    return name


def load(name: str) -> None:
    """Load a profile by name (registering ours first); a UserError naming the known ones otherwise."""
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    from hazards.engine.errors import UserError

    register_profiles()
    try:
        settings.load_profile(name)
    except InvalidArgument:
        raise UserError(f"unknown hypothesis profile {name!r} (from ${PROFILE_ENV}); "
                        f"known: {', '.join(PROFILES)} and any registered by your conftest") from None
