"""`hz_family_server`: a warm family launch server for a test, and what a failing point gets.

`hz_family_server("pipeline")` builds the family's binary (cached, `hazards.engine.build`),
starts its `--serve` launch server on this process's leased GPU (through
`hazards.stress_family.family_target`) and returns a `FamilyServer`; every server the
test opened is closed after it. `FamilyServer.run(params)` runs one point (a batch of
launches) and remembers it. More in docs/pytest-plugin.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import pytest

from hazards.replay import PointRate, failure_note, measure_point, repro_command, target_mismatch_rate
from hazards.engine.outcome import RunResult

_SERVERS_KEY = pytest.StashKey[list]()


@dataclasses.dataclass
class FamilyServer:
    """A running launch server for one family (any variant; `variant` is the default)."""

    family: str
    target: Any  # a hazards.engine.targets.ServerTarget, or any object with its run()/close()
    variant: str | None = None
    launches: int = 200
    timeout: float = 20.0
    last_params: dict[str, Any] | None = None
    last_result: RunResult | None = None

    def point(self, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """`params` with the default variant filled in."""
        p = dict(params or {})
        if self.variant is not None:
            p.setdefault("variant", self.variant)
        return p

    def run(self, params: dict[str, Any] | None = None, *, launches: int | None = None,
            timeout: float | None = None) -> RunResult:
        """Run one point (one request of `launches` launches) and remember it."""
        p = self.point(params)
        self.last_params, self.last_result = p, None
        _note(f"hazards: replay with `{repro_command(self.family, p)}`")
        result = self.target.run(p, timeout=timeout or self.timeout, launches=launches or self.launches)
        self.last_result = result
        return result

    def target_rate(self, result: RunResult) -> float | None:
        """`hypothesis.target` the run's mismatch rate (see hazards.replay.target_mismatch_rate)."""
        return target_mismatch_rate(result)

    def rate_at(self, params: dict[str, Any], runs: int, conf: float = 0.95) -> PointRate:
        """Re-run one point `runs` times: k/R failed with an exact CI."""
        def once(p: dict[str, Any]) -> RunResult:
            return self.target.run(p, timeout=self.timeout, launches=self.launches)

        return measure_point(self.family, self.point(params), once, runs, conf)

    def close(self) -> None:
        self.target.close()


def _note(text: str) -> None:
    try:
        from hypothesis import note
        from hypothesis.control import currently_in_test_context
    except ImportError:
        return
    if currently_in_test_context():
        note(text)


def open_family_server(family: Any, variant: str | None = None, *, make_target: Callable[[], Any] | None = None,
                       launches: int | None = None, timeout: float | None = None,
                       respawn_every: int = 0, env: dict[str, str] | None = None) -> FamilyServer:
    """A started FamilyServer. `family` is a catalog name or `Family`. With `make_target`
    (a zero-argument factory: a test double, a prebuilt server) `family` may be any name
    and nothing is built."""
    if make_target is None:
        from hazards.families import get_family
        from hazards.stress_family import family_target

        fam = get_family(family) if isinstance(family, str) else family
        if variant is not None:
            fam.variant(variant)  # UserError naming the known variants
        target = family_target(fam, respawn_every=respawn_every, env=env)
        name, launches = fam.name, launches or fam.default_launches
        timeout = timeout or fam.timeout_s
    else:
        target = make_target()
        name = family if isinstance(family, str) else family.name
    server = FamilyServer(name, target, variant, launches or 200, timeout or 20.0)
    start = getattr(target, "start", None)
    if start is not None:
        try:
            start()  # a server that cannot shake hands fails the test's setup, not a run
        except BaseException:
            target.close()
            raise
    return server


@pytest.fixture
def hz_family_server(request: pytest.FixtureRequest) -> Iterator[Callable[..., FamilyServer]]:
    """Factory: `hz_family_server(family, variant=None, *, make_target=None, launches=None,
    timeout=None, respawn_every=0, env=None)` -> a running `FamilyServer`.

    The server runs on the GPU this pytest process leased (CUDA_VISIBLE_DEVICES is set
    at start-up by the plugin). Calling the factory again with the same arguments returns
    the same warm server, so a hypothesis test may call it in its body: every example
    reuses one server. Every server opened is closed after the test.
    """
    servers: list[FamilyServer] = []
    by_key: dict[tuple, FamilyServer] = {}
    request.node.stash[_SERVERS_KEY] = servers

    def make(family: Any, variant: str | None = None, **kwargs: Any) -> FamilyServer:
        key = (getattr(family, "name", family), variant,
               tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        if key not in by_key:
            by_key[key] = open_family_server(family, variant, **kwargs)
            servers.append(by_key[key])
        return by_key[key]

    try:
        yield make
    finally:
        for server in servers:
            server.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if call.when != "call" or not report.failed:
        return report
    servers = [s for s in item.stash.get(_SERVERS_KEY, []) if s.last_params is not None]
    runs = item.config.getoption("hz_point_runs")
    for server in servers:
        rate = None
        if runs > 0:
            try:
                rate = server.rate_at(server.last_params, runs)
            except Exception as e:  # the report must not be lost to a broken re-run
                report.sections.append(("hazards: failing point", f"re-running the point failed: {e!r}"))
        text = failure_note(server.family, server.last_params, rate, server.last_result)
        report.sections.append((f"hazards: failing point ({server.family})", text))
        if rate is not None:
            report.user_properties.append(("hz_point_rate", f"{rate.failed}/{rate.n}"))
    return report
