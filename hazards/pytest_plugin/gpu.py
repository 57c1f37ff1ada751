"""The `hz_gpu` marker, one exclusive GPU lease per pytest process, and the `hz_gpu` fixture.

Active only in a session that opted in (see `hazards.pytest_plugin.entry_point`). Every
pytest process that runs tests (a plain session, or each pytest-xdist worker; never the
xdist controller) then leases one free GPU through `hazards.engine.leases` as early as the
plugin can act: in `pytest_load_initial_conftests`, before conftests and test modules are
imported, so CUDA_VISIBLE_DEVICES is set before any CUDA use in that process (a CUDA
runtime reads it once, at initialisation). `pytest -n 2` on two GPUs therefore pins the
two workers to distinct devices. A process that finds no free GPU sets
CUDA_VISIBLE_DEVICES to the empty string (so it cannot touch a GPU someone else leased)
and its `hz_gpu` tests skip, saying why. More in docs/pytest-plugin.md.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Iterator

import pytest

MARKER = "hz_gpu"
CHILD_ENV = "HZ_PYTEST_CHILD"  # set in children of hz_timeout: they inherit the parent's lease
_STATE_KEY = pytest.StashKey["LeaseState"]()


@dataclasses.dataclass
class LeaseState:
    """What this pytest process holds: a lease, or the reason it holds none."""

    lease: object | None = None  # hazards.engine.leases.GpuLease
    reason: str = ""
    saved_env: dict[str, str | None] = dataclasses.field(default_factory=dict)

    @property
    def visible_devices(self) -> str | None:
        return self.lease.visible_devices if self.lease is not None else None  # type: ignore[attr-defined]


def _worker_id() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _is_controller(config: pytest.Config) -> bool:
    """True for the xdist controller (it distributes tests; its workers hold the leases)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or hasattr(config, "workerinput"):
        return False
    ns = getattr(config, "known_args_namespace", None) or config.option
    return bool(getattr(ns, "numprocesses", None) or getattr(ns, "tx", None))


def _option(config: pytest.Config, name: str, default):
    ns = getattr(config, "known_args_namespace", None)
    if ns is not None and hasattr(ns, name):
        return getattr(ns, name)
    return getattr(config.option, name, default)


def lease_for_session(config: pytest.Config) -> LeaseState:
    """Take this process's lease (once) and export its CUDA_VISIBLE_DEVICES."""
    state = config.stash.get(_STATE_KEY, None)
    if state is not None:
        return state
    state = LeaseState()
    config.stash[_STATE_KEY] = state
    if os.environ.get(CHILD_ENV):
        state.reason = "inherited from the parent test process"
        return state
    if _is_controller(config):
        state.reason = "the xdist controller leases nothing; each worker holds its own GPU"
        return state
    if _option(config, "hz_no_lease", False):
        state.reason = "--hz-no-lease: using CUDA_VISIBLE_DEVICES as given"
        return state
    from hazards.engine import leases

    if not leases.lease_candidates():
        state.reason = "no GPU visible to this process"
        return state
    holder = f"pytest:{_worker_id()}"
    got, refused = leases.acquire_free(holder, max_gpus=1, wait_s=float(_option(config, "hz_lease_wait", 0.0)))
    for key in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", leases.LEASE_ENV):
        state.saved_env[key] = os.environ.get(key)
    if got:
        state.lease = got[0]
        os.environ.update(got[0].env())
    else:
        why = "; ".join(f"GPU {g}: {msg}" for g, msg in refused.items()) or "none free"
        state.reason = f"no free GPU lease for pytest process {_worker_id()} ({why})"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # never touch a GPU someone else holds
    return state


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: needs a usable NVIDIA GPU (skipped without one, saying why)")
    lease_for_session(config)  # no-op when the entry point took it in pytest_load_initial_conftests


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    # Every test has run. Release here, not only at unconfigure: an xdist worker may be
    # torn down by its controller before it gets that far (the OS would still drop the
    # flock, but the lease log would miss the release).
    release_session_lease(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    release_session_lease(config)


def release_session_lease(config: pytest.Config) -> None:
    """Give this process's GPU back and restore CUDA_VISIBLE_DEVICES (idempotent)."""
    state = config.stash.get(_STATE_KEY, None)
    if state is None or state.lease is None and not state.saved_env:
        return
    if state.lease is not None:
        state.lease.release()  # type: ignore[attr-defined]
        state.lease = None
    for key, value in state.saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    state.saved_env.clear()


def pytest_report_header(config: pytest.Config) -> str | None:
    state = config.stash.get(_STATE_KEY, None)
    if state is None:
        return None
    if state.lease is not None:
        lease = state.lease
        return f"hazards: GPU lease {lease.visible_devices} ({lease.holder}, lock {lease.lock_path})"  # type: ignore[attr-defined]
    return f"hazards: no GPU lease: {state.reason}"


def lease_state(config: pytest.Config) -> LeaseState:
    """This process's lease state (the lease is taken on first use if not yet)."""
    return lease_for_session(config)


def gpu_skip_reason(config: pytest.Config) -> str | None:
    """Why an `hz_gpu` test cannot run here, or None when a GPU is usable."""
    from hazards.engine.gpus import gpu_available

    state = lease_state(config)
    if state.lease is None and state.reason.startswith("no free GPU lease"):
        return state.reason
    if not gpu_available():
        return ("no usable NVIDIA GPU (NVML/nvidia-smi found none, or CUDA_VISIBLE_DEVICES is empty)"
                + (f"; lease: {state.reason}" if state.reason else ""))
    return None


@pytest.hookimpl(trylast=True)  # after conftests that mark items (e.g. map their own marker to hz_gpu)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker(MARKER) for item in items):
        return
    reason = gpu_skip_reason(config)
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker(MARKER):
            item.add_marker(skip)


@pytest.fixture
def hz_gpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The GPU this pytest process leased, as its CUDA_VISIBLE_DEVICES entry.

    The test's environment carries it (children started by the test inherit it). Skips
    with the reason when this process holds no lease.
    """
    state = lease_state(request.config)
    if state.lease is None:
        inherited = os.environ.get(CHILD_ENV) and os.environ.get("CUDA_VISIBLE_DEVICES")
        if inherited:  # an hz_timeout child runs on its parent's lease
            yield inherited
            return
        pytest.skip(f"no GPU lease: {state.reason}")
    for key, value in state.lease.env().items():  # type: ignore[attr-defined]
        monkeypatch.setenv(key, value)
    yield state.visible_devices  # type: ignore[misc]
