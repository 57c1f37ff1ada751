"""This repository's own `gpu` marker is the plugin's `hz_gpu` (skipped without a usable GPU).

The plugin is on for this repository through `-p hazards` in pyproject.toml's addopts (the
entry point when installed, the checkout's package otherwise). `gpu` stays this project's
own marker name (registered in pyproject.toml); the plugin never acts on a bare `gpu`.
"""
import itertools
import signal

import pytest

_STRAY_SLEEPS = itertools.count(1)  # stray_sleep's markers: one per use in this process


def pytest_configure(config: pytest.Config) -> None:
    # A session started with SIGINT ignored (a background job of a non-interactive shell,
    # `nohup ... &`, some CI runners) hands SIG_IGN to every child, and Python keeps it: the
    # tests that press Ctrl-C on a `hazards` child then wait out their deadlines (~60 s each,
    # three of them). The tests' children take Ctrl-C as from a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("gpu") is not None and item.get_closest_marker("hz_gpu") is None:
            item.add_marker(pytest.mark.hz_gpu)


@pytest.fixture
def refuses_file(tmp_path):
    """`refuses_file(load, text, message)`: write `text` to a file, and check that `load(path)`
    refuses it with a one-line UserError containing `message` (taken literally)."""
    import re

    from hazards.engine.errors import UserError

    def check(load, text: str, message: str) -> None:
        path = tmp_path / "bad.toml"
        path.write_text(text)
        with pytest.raises(UserError, match=re.escape(message)) as refused:
            load(path)
        assert "\n" not in str(refused.value)

    return check


@pytest.fixture
def stray_sleep():
    """`stray_sleep.command`: a shell line that starts a `sleep` no other test starts (hours
    long); `stray_sleep.running()`: the processes running that sleep; `stray_sleep.left()`: the
    same, killed on the way. A command killed on a timeout must take the sleep with it:
    `assert not stray_sleep.left()`."""
    import os
    import types

    import psutil

    marker = f"{90000 + os.getpid()}.{next(_STRAY_SLEEPS)}"

    def running() -> list:
        return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", marker]]

    def left() -> list:
        found = running()
        for p in found:
            p.kill()
        return found

    return types.SimpleNamespace(command=f"sleep {marker}; true", running=running, left=left)


@pytest.fixture(scope="session", autouse=True)
def loopback_only():
    """Every Python-level connect of the test run to an address off loopback (and every DNS
    lookup) raises `loopback.OffLoopback`. Ray's C++/gRPC and subprocesses are
    not covered: see tests/loopback.py."""
    from loopback import guard_connects, unguard_connects

    guard_connects()
    yield
    unguard_connects()


@pytest.fixture(autouse=True)
def no_connect_off_loopback(loopback_only):
    """Fail the test that tried to reach an address off loopback, even if the code under
    test caught the error."""
    from loopback import take_attempts

    take_attempts()
    yield
    tried = take_attempts()
    assert not tried, "this test tried to leave loopback: " + "; ".join(tried)
