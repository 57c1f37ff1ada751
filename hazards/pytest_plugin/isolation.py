"""Hangs inside tests, handled out of process: `@pytest.mark.hz_timeout(s)`, `hz_run_out_of_process`.

pytest-timeout's signal method raises in the main thread, which never happens while that
thread sits in a GIL-released CUDA call (a spinning kernel's synchronize); its thread
method kills the whole pytest process. Here the GPU body runs in a child that the
engine's watchdog (`hazards.engine.watchdog` through `hazards.engine.targets.command.CommandTarget`)
supervises: on expiry the on-hang collectors run (tripwire snapshot, ...), then the
child's process group is killed and checked gone; the test fails with outcome `hang`
and that evidence, and the session goes on. More in docs/pytest-plugin.md.
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

from hazards.pytest_plugin.gpu import CHILD_ENV
from hazards.engine.outcome import Outcome, RunResult

REPORTS_ENV = "HZ_CHILD_REPORTS"
DEFAULT_STARTUP_S = 20.0
_TAIL_LINES = 30


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(REPORTS_ENV)
    if path and os.environ.get(CHILD_ENV):
        config.pluginmanager.register(ChildReportWriter(config, path), "hazards-child-report-writer")
    config.addinivalue_line(
        "markers",
        "hz_timeout(seconds, startup=20): run the test in a supervised child process; a body "
        "running past `seconds` (or start-up/setup, teardown past `startup`) fails it as `hang`")


# --- the child side: write every report where the parent reads them ----------------------

class ChildReportWriter:
    """In an hz_timeout child: append each report, serialized, to $HZ_CHILD_REPORTS."""

    def __init__(self, config: pytest.Config, path: str) -> None:
        self.config = config
        self.path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        with open(self.path, "a", encoding="utf-8") as f:  # closed per report: survives a later kill
            f.write(json.dumps(data) + "\n")


# --- the parent side -----------------------------------------------------------------

def _marker_limits(marker: pytest.Mark) -> tuple[float, float]:
    seconds = marker.args[0] if marker.args else marker.kwargs.get("seconds")
    startup = marker.kwargs.get("startup", DEFAULT_STARTUP_S)
    try:
        seconds, startup = float(seconds), float(startup)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"hz_timeout needs a number of seconds, got {marker.args!r} {marker.kwargs!r}") from None
    if seconds <= 0 or startup < 0:
        raise pytest.UsageError(f"hz_timeout: seconds must be > 0 and startup >= 0, got {seconds}, {startup}")
    return seconds, startup


def _repetition_options(config: pytest.Config) -> list[str]:
    """The options that make the parent collect repetitions (`test_x[hzrep2of5]`,
    `test_x[2-5]`, `test_x[3]`): the child must collect the same node ids."""
    argv = []
    if config.getoption("hz_repeat", None):
        argv += ["--hz-repeat", str(config.getoption("hz_repeat"))]
    if config.pluginmanager.has_plugin("repeat") and (config.getoption("count", 1) or 1) > 1:
        argv += ["--count", str(config.getoption("count")), "--repeat-scope", config.getoption("repeat_scope")]
    if config.getoption("flake_finder_enable", False):
        argv += ["--flake-finder", "--flake-runs", str(config.getoption("flake_runs"))]
    return argv


def child_argv(item: pytest.Item) -> list[str]:
    """`python -m pytest <nodeid> -p hazards` with this session's ini file, rootdir and the
    options that change what is collected (repetitions) or reported (--hz-point-runs);
    other command-line options are not passed on."""
    config = item.config
    # `-p hazards`: the entry point when installed, this package otherwise; opts in either way.
    argv = [sys.executable, "-m", "pytest", item.nodeid, "-p", "hazards",
            "--rootdir", str(config.rootpath), "-o", "addopts=", "-p", "no:cacheprovider", "-q"]
    if config.inipath is not None:
        argv += ["-c", str(config.inipath)]
    argv += _repetition_options(config)
    argv += ["--hz-point-runs", str(config.getoption("hz_point_runs", 0))]
    if config.pluginmanager.has_plugin("xdist"):
        argv += ["-p", "no:xdist"]
    return argv


def _child_env(config: pytest.Config, reports: Path) -> dict[str, str]:
    from hazards.pytest_plugin.hypo import profile_for_children

    env = {CHILD_ENV: "1", REPORTS_ENV: str(reports)}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        env[key] = ""  # the child is a plain session on its parent's lease
    profile = profile_for_children(config)
    if profile is not None:
        env["HZ_HYPOTHESIS_PROFILE"] = profile
    return env


def _tail(text: str, lines: int = _TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def describe_run(result: RunResult, what: str) -> str:
    """A failure message: outcome, reason, kill/collector evidence and the output tails."""
    ev = result.evidence
    parts = [f"{what}: {result.outcome.value}: {result.reason} (after {result.duration_s:.1f}s)"]
    if ev.get("killed"):
        parts.append(f"killed process group: pids {ev['killed']}; survivors: {ev.get('survivors') or 'none'}")
    if ev.get("collectors"):
        parts.append("on-hang collectors: " + json.dumps(ev["collectors"], default=str)[:4000])
    for stream in ("stderr_tail", "stdout_tail"):
        if ev.get(stream, "").strip():
            parts.append(f"--- child {stream.replace('_', ' ')} ---\n{_tail(ev[stream])}")
    return "\n".join(parts)


def _synth(item: pytest.Item, when: str, outcome: str, longrepr: str | None, duration: float) -> pytest.TestReport:
    now = time.time()
    return pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, outcome, longrepr, when,
                             sections=[], duration=duration, start=now - duration, stop=now,
                             user_properties=list(item.user_properties))


def _phases_written(path: Path) -> set[str]:
    whens = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            whens.add(json.loads(line).get("when"))
        except ValueError:
            continue  # a line being written right now
    return whens


def supervise_test_child(argv: list[str], env: dict[str, str], cwd: str, reports: Path, name: str,
                         seconds: float, startup: float) -> RunResult:
    """Run the child pytest under the watchdog with per-phase deadlines; judge how it ended.

    Deadlines: `startup` until the setup report (collection, fixtures), then `seconds` for
    the test body (until the call report), then `startup` again for teardown and exit.
    On expiry the on-hang collectors run and the process group is killed (a `hang`).
    """
    from hazards.engine.classify import NOTABLE_RE, classify_exit
    from hazards.engine.targets.base import check_env
    from hazards.engine.targets.command import tail_text
    from hazards.engine.watchdog import Supervised

    started_at, t0 = time.time(), time.monotonic()
    child = Supervised(argv, env=check_env(env), cwd=cwd, target=name, notable_re=NOTABLE_RE)
    deadline, phase, limit = t0 + startup, "setup", startup
    try:
        while True:
            exited = child.wait_exit(min(deadline, time.monotonic() + 0.05))
            if exited:
                break
            seen = _phases_written(reports)
            if phase == "setup" and "setup" in seen:
                deadline, phase, limit = time.monotonic() + seconds, "call", seconds
            if phase == "call" and "call" in seen:
                deadline, phase, limit = time.monotonic() + startup, "teardown", startup
            if time.monotonic() >= deadline:
                break
        kill_evidence = child.kill() if exited else child.hang()
    finally:
        child.kill()
    outcome, reason, evidence = classify_exit(child.proc.returncode if exited else None, child.stdout_text(),
                                              child.stderr_text(), timed_out=not exited, timeout=limit)
    evidence.update(kill_evidence, phase=phase, pid=child.pid)
    if outcome is not Outcome.CLEAN:
        evidence["stdout_tail"] = tail_text(child.stdout_drain.tail())
        evidence["stderr_tail"] = tail_text(child.stderr_drain.tail())
    return RunResult(outcome=outcome, reason=reason if exited else f"{reason} in the test's {phase} phase",
                     target=name, evidence=evidence, started_at=started_at, duration_s=time.monotonic() - t0,
                     error_kind=evidence.get("error_kind"))


def run_item_in_child(item: pytest.Item, seconds: float, startup: float) -> list[pytest.TestReport]:
    """Run one test in a supervised child; its reports, completed by synthesized ones."""
    config = item.config
    with tempfile.TemporaryDirectory(prefix="hz-child-") as tmp:
        reports_path = Path(tmp) / "reports.jsonl"
        reports_path.touch()
        result = supervise_test_child(child_argv(item), _child_env(config, reports_path), str(config.rootpath),
                                      reports_path, f"pytest {item.nodeid}", seconds, startup)
        lines = reports_path.read_text(encoding="utf-8").splitlines()
    reports = []
    for line in lines:
        rep = config.hook.pytest_report_from_serializable(config=config, data=json.loads(line))
        if isinstance(rep, pytest.TestReport) and rep.nodeid == item.nodeid:
            reports.append(rep)
    phases = {r.when for r in reports}
    if "teardown" in phases:
        # The child ran the test to its end: its verdict stands, unless the process then
        # hung or crashed on its way out (a kernel still spinning when the context is torn
        # down): that is a hazard of this test, never a pass.
        died = result.outcome is Outcome.FAULT and "signal" in result.evidence
        if result.outcome is Outcome.HANG or died:
            what = ("hz_timeout: the child pytest did not exit within "
                    f"{startup:g}s after the test's teardown" if not died else
                    "hz_timeout: the child pytest died after the test's teardown")
            for rep in reports:
                if rep.when == "teardown" and rep.passed:
                    rep.outcome, rep.longrepr = "failed", describe_run(result, what)
                rep.user_properties.append(("hz_outcome", result.outcome.value))
        return reports
    if result.outcome is Outcome.HANG and result.evidence.get("phase") == "call":
        what = f"hz_timeout: test body still running after {seconds:g}s"
    elif result.outcome is Outcome.HANG:
        what = f"hz_timeout: test {result.evidence.get('phase')} still running after {startup:g}s"
    elif not reports:
        what = "hz_timeout: the child pytest ran no test (collection failed or the node id differs)"
    else:
        what = "hz_timeout: the test's child process died"
    longrepr = describe_run(result, what)
    if "setup" not in phases:
        reports.append(_synth(item, "setup", "failed", longrepr, result.duration_s))
    elif "call" not in phases and all(r.passed for r in reports):
        reports.append(_synth(item, "call", "failed", longrepr, result.duration_s))
        longrepr = None
    reports.append(_synth(item, "teardown", "failed" if longrepr and "call" in phases else "passed",
                          longrepr if "call" in phases else None, 0.0))
    for rep in reports:
        rep.user_properties.append(("hz_outcome", result.outcome.value))
    return reports


# pytest-timeout asks its `pytest_timeout_set_timer` hook (firstresult) to arm a timer
# around each test. An hz_timeout test is supervised here, with its own limits: its timer
# would fire inside this plugin's supervision (SIGALRM raising in a hook is an
# INTERNALERROR; the thread method kills the session), and in the child it would race the
# supervisor. So for hz_timeout tests this plugin answers "set" and arms nothing: the
# hz_timeout limits replace a global --timeout for that test, as pytest-timeout's own
# marker would.

@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> bool | None:  # noqa: ARG001
    return True if item.get_closest_marker("hz_timeout") is not None else None


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    return True if item.get_closest_marker("hz_timeout") is not None else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    marker = item.get_closest_marker("hz_timeout")
    if marker is None or os.environ.get(CHILD_ENV):
        return None  # not isolated, or we are the child: run it here
    seconds, startup = _marker_limits(marker)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in run_item_in_child(item, seconds, startup):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


# --- running one callable or command out of process ------------------------------------

class OutOfProcessFailure(AssertionError):
    """The child did not finish clean; `.result` holds the judged RunResult."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


def run_out_of_process(fn_or_argv: Callable[..., Any] | Sequence[str], timeout: float, *,
                       args: tuple = (), kwargs: dict[str, Any] | None = None,
                       env: dict[str, str] | None = None, check: bool = True) -> Any:
    """Run `fn_or_argv` in a supervised child that is killed (whole group) after `timeout` s.

    A callable must be picklable by reference (a module-level function) with picklable
    args; its return value comes back. An argv list runs as a command target (exit-code
    convention of docs/protocol.md). With `check=True` a result other than `clean` raises
    OutOfProcessFailure (an AssertionError, so pytest shows it as a test failure) naming
    the outcome and carrying the output tails; with `check=False` the RunResult is
    returned (for a callable: `(RunResult, value or None)`).
    """
    from hazards.engine.targets.command import CommandTarget

    if callable(fn_or_argv):
        with tempfile.TemporaryDirectory(prefix="hz-oop-") as tmp:
            payload, out = Path(tmp) / "call.pkl", Path(tmp) / "value.pkl"
            blob = pickle.dumps((fn_or_argv, tuple(args), dict(kwargs or {})))
            payload.write_bytes(pickle.dumps((list(sys.path), blob)))
            name = f"{getattr(fn_or_argv, '__module__', '?')}.{getattr(fn_or_argv, '__qualname__', '?')}"
            argv = [sys.executable, "-m", "hazards.pytest_plugin.child_call", str(payload), str(out)]
            with CommandTarget(argv, env=env, name=name) as target:
                result = target.run(timeout=timeout)
            value = pickle.loads(out.read_bytes()) if result.outcome is Outcome.CLEAN and out.exists() else None
    else:
        with CommandTarget(list(fn_or_argv), env=env) as target:
            result = target.run(timeout=timeout)
        value = None
    if check and result.outcome is not Outcome.CLEAN:
        raise OutOfProcessFailure(describe_run(result, f"out-of-process run of {result.target}"), result)
    if check:
        return value
    return (result, value) if callable(fn_or_argv) else result


@pytest.fixture
def hz_run_out_of_process() -> Callable[..., Any]:
    """`run_out_of_process` as a fixture: `hz_run_out_of_process(fn_or_argv, timeout, ...)`."""
    return run_out_of_process
