"""Failure rates of repeated tests: `--hz-repeat N`, or pytest-repeat / pytest-flakefinder.

A hazard test that fails 1 run in 20 passes most of the time; a pass/fail verdict from one
run says little, a rate with a confidence interval says how much. `--hz-repeat N`
repeats every test as parametrized items (`test_x[hzrep3of20]`), so repetitions spread
over pytest-xdist workers like any other items; the controller aggregates the reports it
receives. Repetitions made by pytest-repeat (`--count N`, `@pytest.mark.repeat(n)`) or
pytest-flakefinder (`--flake-finder`) are counted the same way, as attempts of one test;
`--hz-repeat` together with one of them is a usage error (the counts would multiply).
More in docs/pytest-plugin.md.
"""
from __future__ import annotations

import dataclasses

import pytest

REPEAT_FIXTURE = "hz_repeat_index"
PYTEST_REPEAT_FIXTURE = "__pytest_repeat_step_number"  # pytest-repeat's parameter
FLAKEFINDER_PREFIX = "__flakefinder_"  # pytest-flakefinder's parameter: this prefix + the function name
MAX_LINES = 40  # beyond this, only tests that failed at least once are listed


@dataclasses.dataclass
class TestRate:
    """Attempts of one test (all its repetitions) and how they ended."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    hypothesis_flaky: int = 0
    new_search_each_run: bool = False  # a hypothesis test drawing its examples anew each run

    @property
    def n(self) -> int:
        return self.passed + self.failed

    @property
    def flaky(self) -> bool:
        """Both passed and failed (unless those were independent hypothesis searches), or
        hypothesis saw a failure that did not reproduce."""
        varied = self.passed > 0 and self.failed > 0 and not self.new_search_each_run
        return varied or self.hypothesis_flaky > 0


class RateBook:
    """Per-test attempt counts, fed by `pytest_runtest_logreport` (controller side)."""

    def __init__(self) -> None:
        self.tests: dict[str, TestRate] = {}
        self._open: dict[str, str] = {}  # repetition nodeid -> "failed" / "passed" / "skipped"

    def add(self, report: pytest.TestReport) -> None:
        """Account one phase report."""
        base = base_nodeid_of(report)
        rate = self.tests.setdefault(base, TestRate())
        props = dict(report.user_properties)
        if report.when == "call":
            if props.get("hz_flaky") == "hypothesis":
                rate.hypothesis_flaky += 1
            if props.get("hz_search") == "new":
                rate.new_search_each_run = True
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


def repetition_ids(item: pytest.Item) -> list[str]:
    """The parameter ids that number this item's repetitions (ours, pytest-repeat's,
    flakefinder's), as each plugin writes them."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return []
    ids = []
    for name, index in callspec.params.items():
        if name == REPEAT_FIXTURE:
            ids.append(f"hzrep{index + 1}of{item.config.getoption('hz_repeat')}")
        elif name == PYTEST_REPEAT_FIXTURE:
            marker = item.get_closest_marker("repeat")
            count = int(marker.args[0]) if marker is not None else item.config.getoption("count")
            ids.append(f"{index + 1}-{count}")
        elif name.startswith(FLAKEFINDER_PREFIX):
            ids.append(str(index))
    return ids


def base_nodeid(item: pytest.Item) -> str:
    """The node id without the repetition parts of its parameter id:
    `t.py::f[a-hzrep2of5]` -> `t.py::f[a]`, `t.py::f[2-5]` -> `t.py::f`."""
    callspec = getattr(item, "callspec", None)
    reps = repetition_ids(item)
    parts = list(getattr(callspec, "_idlist", ()))  # one id per parametrization, joined by "-"
    suffix = f"[{callspec.id}]" if callspec is not None else ""
    if not reps or not item.nodeid.endswith(suffix) or "-".join(parts) != callspec.id:
        return item.nodeid
    for rep in reps:
        if rep not in parts:
            return item.nodeid  # an id format we do not know: count this item on its own
        parts.remove(rep)
    rest = "-".join(parts)
    return item.nodeid[: -len(suffix)] + (f"[{rest}]" if rest else "")


def repeat_count(config: pytest.Config) -> int | None:
    n = config.getoption("hz_repeat")
    if n is not None and n < 1:
        raise pytest.UsageError(f"--hz-repeat must be at least 1, got {n}")
    return n


def other_repeater(config: pytest.Config) -> str | None:
    """The other plugin that repeats every test in this session, as its option says it."""
    count = config.getoption("count", None)
    if count is not None and count > 1 and config.pluginmanager.has_plugin("repeat"):
        return f"pytest-repeat --count {count}"
    if config.getoption("flake_finder_enable", False):
        return f"flakefinder --flake-runs {config.getoption('flake_runs')}"
    return None


def repetition_source(config: pytest.Config) -> str | None:
    """What repeats the tests of this session (for the table's title), or None."""
    n = repeat_count(config)
    return f"--hz-repeat {n}" if n else other_repeater(config)


def pytest_configure(config: pytest.Config) -> None:
    other = other_repeater(config)
    if repeat_count(config) and other:
        raise pytest.UsageError(f"--hz-repeat and {other} both repeat every test: give one "
                                "(the rate table counts either's repetitions)")
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
        base = base_nodeid(item)
        if base != item.nodeid:
            item.user_properties.append(("hz_base", base))


def _hypothesis_search(item: pytest.Item) -> str | None:
    """"new" for a hypothesis test that draws its examples anew each run, "fixed" for one
    whose search repeats (derandomize, @seed, --hypothesis-seed), None for other tests."""
    test = getattr(item, "obj", None)
    if not getattr(test, "is_hypothesis_test", False):
        return None
    from hypothesis import settings

    # The settings in effect for this test (hypothesis keeps them on the wrapped function).
    used = getattr(test, "_hypothesis_internal_use_settings", None) or settings.default
    seeded = getattr(test, "_hypothesis_internal_use_seed", None) is not None or \
        item.config.getoption("hypothesis_seed", None) is not None
    return "fixed" if used.derandomize or seeded else "new"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if call.when != "call":
        return report
    search = _hypothesis_search(item)
    if search is not None:
        report.user_properties.append(("hz_search", search))
    if call.excinfo is not None:
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
        if r.new_search_each_run and r.failed and not r.flaky:
            note = (f" (hypothesis: a new search each run; {r.failed} of {r.n} found a failing example "
                    "that failed again when replayed)")
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
        source = repetition_source(config)
        repeated = any(r.n + r.skipped > 1 for r in book.tests.values())  # e.g. @pytest.mark.repeat(n)
        if source is None and not repeated and not book.flaky:
            return
        conf = config.getoption("hz_conf")
        tr = terminalreporter
        title = f"hazards: failure rates{f' ({source})' if source else ''}"
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
