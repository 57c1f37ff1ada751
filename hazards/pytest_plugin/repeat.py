"""`--hz-repeat N`: run every test N times and report its failure rate with an exact CI.

A hazard test that fails 1 run in 20 passes most of the time; a pass/fail verdict from one
run says little, a rate with a confidence interval says how much. Repetitions are
parametrized items (`test_x[hzrep3of20]`), so they spread over pytest-xdist workers like
any other items; the controller aggregates the reports it receives.

A test is *flaky* when, over its attempts, it both passed and failed. Attempts counted as
failed: a failed phase (setup, call or teardown), an `xfail` that failed, a pytest-
rerunfailures rerun, a hypothesis FlakyFailure. pytest's own exit status is unchanged
(a failed repetition fails the session as usual); `--hz-fail-on-flaky` additionally fails
the session when a flaky test did not already fail it (a non-strict xfail that sometimes
passes, a test that passed on a rerun).
"""
from __future__ import annotations

import dataclasses
import re

import pytest

REPEAT_FIXTURE = "hz_repeat_index"
_REP_TOKEN = re.compile(r"(?:^|-)hzrep\d+of\d+(?=-|$)")
MAX_LINES = 40  # beyond this, only tests that failed at least once are listed


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hazards", "gpu-hazards")
    group.addoption("--hz-repeat", type=int, default=None, metavar="N",
                    help="run each test N times and report its failure rate with a confidence interval")
    group.addoption("--hz-fail-on-flaky", action="store_true", default=False,
                    help="fail the session when a test both passed and failed (flaky)")
    group.addoption("--hz-conf", type=float, default=0.95, metavar="C",
                    help="confidence level of the failure-rate intervals (default 0.95)")


@dataclasses.dataclass
class TestRate:
    """Attempts of one test (all its repetitions) and how they ended."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    hypothesis_flaky: int = 0

    @property
    def n(self) -> int:
        return self.passed + self.failed

    @property
    def flaky(self) -> bool:
        """Both passed and failed, or hypothesis saw a failure that did not reproduce."""
        return (self.passed > 0 and self.failed > 0) or self.hypothesis_flaky > 0


class RateBook:
    """Per-test attempt counts, fed by `pytest_runtest_logreport` (controller side)."""

    def __init__(self) -> None:
        self.tests: dict[str, TestRate] = {}
        self._open: dict[str, str] = {}  # repetition nodeid -> "failed" / "passed" / "skipped"

    def add(self, report: pytest.TestReport) -> None:
        """Account one phase report."""
        base = base_nodeid_of(report)
        rate = self.tests.setdefault(base, TestRate())
        if dict(report.user_properties).get("hz_flaky") == "hypothesis" and report.when == "call":
            rate.hypothesis_flaky += 1
        if report.outcome == "rerun":  # pytest-rerunfailures: one failed attempt, retried
            rate.failed += 1
            self._open.pop(report.nodeid, None)
            return
        state = self._open.get(report.nodeid)
        if report.failed:
            state = "failed"
        elif report.when == "call":
            if report.passed:  # includes xpassed
                state = state or "passed"
            elif hasattr(report, "wasxfail"):
                state = "failed"  # the body failed as it was expected to: still a failed attempt
            else:
                state = state or "skipped"
        elif report.skipped and state is None:
            state = "skipped"
        self._open[report.nodeid] = state or ""
        if report.when == "teardown":
            final = self._open.pop(report.nodeid, "")
            if final == "failed":
                rate.failed += 1
            elif final == "passed":
                rate.passed += 1
            else:
                rate.skipped += 1

    @property
    def flaky(self) -> list[str]:
        return [name for name, r in self.tests.items() if r.flaky]


def base_nodeid_of(report: pytest.TestReport) -> str:
    """The test's node id without the repetition part of its parameter id."""
    props = dict(report.user_properties)
    return str(props.get("hz_base", report.nodeid))


def strip_repeat_id(nodeid: str, callspec_id: str) -> str:
    """`t.py::f[a-hzrep2of5]` -> `t.py::f[a]`; `t.py::f[hzrep2of5]` -> `t.py::f`."""
    suffix = f"[{callspec_id}]"
    if not nodeid.endswith(suffix):
        return nodeid
    rest = _REP_TOKEN.sub("", callspec_id)
    if callspec_id.startswith("hzrep"):
        rest = rest[1:] if rest.startswith("-") else rest
    return nodeid[: -len(suffix)] + (f"[{rest}]" if rest else "")


def repeat_count(config: pytest.Config) -> int | None:
    n = config.getoption("hz_repeat")
    if n is not None and n < 1:
        raise pytest.UsageError(f"--hz-repeat must be at least 1, got {n}")
    return n


def pytest_configure(config: pytest.Config) -> None:
    repeat_count(config)
    conf = config.getoption("hz_conf")
    if not 0.0 < conf < 1.0:
        raise pytest.UsageError(f"--hz-conf must be between 0 and 1, got {conf}")
    if not hasattr(config, "workerinput"):  # xdist workers only forward reports
        config.pluginmanager.register(RateReporter(config), RateReporter.NAME)


@pytest.fixture
def hz_repeat_index(request: pytest.FixtureRequest) -> int:
    """0-based repetition number under --hz-repeat (0 without it)."""
    return getattr(request, "param", 0)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    n = repeat_count(metafunc.config)
    if not n or n < 2:
        return
    metafunc.fixturenames.append(REPEAT_FIXTURE)
    metafunc.parametrize(REPEAT_FIXTURE, range(n), indirect=True, ids=[f"hzrep{i + 1}of{n}" for i in range(n)])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and REPEAT_FIXTURE in callspec.params:
            item.user_properties.append(("hz_base", strip_repeat_id(item.nodeid, callspec.id)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if call.excinfo is not None and call.when == "call":
        try:
            from hypothesis.errors import FlakyFailure
        except ImportError:  # hypothesis older than 6.100 (the project pins newer)
            FlakyFailure = ()  # noqa: N806
        if FlakyFailure and call.excinfo.errisinstance(FlakyFailure):
            report.user_properties.append(("hz_flaky", "hypothesis"))
    return report


def summary_lines(book: RateBook, conf: float, verbose: bool) -> list[str]:
    """The rate table: one line per test, flaky ones first."""
    from hazards.engine.stats import format_rate

    rows = sorted(book.tests.items(), key=lambda kv: (not kv[1].flaky, -kv[1].failed, kv[0]))
    rows = [(name, r) for name, r in rows if r.n > 0]
    shown = rows if verbose or len(rows) <= MAX_LINES else [(n, r) for n, r in rows if r.failed]
    lines = []
    for name, r in shown:
        tag = "FLAKY" if r.flaky else "     "
        note = f" (hypothesis FlakyFailure x{r.hypothesis_flaky})" if r.hypothesis_flaky else ""
        lines.append(f"{tag} {r.failed:>4}/{r.n:<4} failed {format_rate(r.failed, r.n, conf):<26} {name}{note}")
    hidden = len(rows) - len(shown)
    if hidden:
        lines.append(f"      ... and {hidden} tests that never failed (-v lists them)")
    return lines


class RateReporter:
    """Controller-side plugin object: counts attempts, prints the table, applies the flag."""

    NAME = "hazards-rate-reporter"

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.book = RateBook()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.book.add(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.config.getoption("hz_fail_on_flaky") and self.book.flaky and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        config, book = self.config, self.book
        repeat = repeat_count(config)
        if repeat is None and not book.flaky:
            return
        conf = config.getoption("hz_conf")
        tr = terminalreporter
        title = f"hazards: failure rates{f' (--hz-repeat {repeat})' if repeat else ''}"
        tr.write_sep("=", title)
        for line in summary_lines(book, conf, verbose=config.getoption("verbose") > 0):
            tr.write_line(line, red=line.startswith("FLAKY"))
        flaky = book.flaky
        if not flaky:
            return
        if config.getoption("hz_fail_on_flaky"):
            tr.write_line(f"{len(flaky)} flaky test(s): the session fails (--hz-fail-on-flaky)", red=True, bold=True)
        else:
            tr.write_line(f"{len(flaky)} flaky test(s) (passed and failed); "
                          "--hz-fail-on-flaky makes that fail the session", yellow=True)
