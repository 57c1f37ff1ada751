"""A failing family point is reported with its parameters, its re-measured rate and the
`hazards repro` line; hypothesis.target steers toward higher mismatch rates."""
from __future__ import annotations

import re
import shlex
import json
import sys
from pathlib import Path

import pytest

from hazards.replay import (PointRate, failure_note, measure_point, mismatch_rate, params_json,
                            repro_argv, repro_command, target_mismatch_rate)
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.stats import format_rate, rate_ci

FAKE = Path(__file__).resolve().parent.parent / "fakes" / "fake_server.py"

FAMILY_TESTS = f"""
    import sys
    from hypothesis import given, strategies as st
    from hazards.engine.outcome import Outcome
    from hazards.engine.targets import ServerTarget

    def fake():
        return ServerTarget([sys.executable, {str(FAKE)!r}], name="fakefam")

    # Every third request fails, whatever the point: an intermittent failure that
    # hypothesis finds, and that may or may not reproduce when it replays the point.
    @given(salt=st.integers(0, 1000))
    def test_fake_family_point_is_clean(hz_family_server, salt):
        server = hz_family_server("fakefam", "flaky", make_target=fake, launches=4)
        result = server.run({{"fail_every": 3, "salt": salt}})
        assert result.outcome is Outcome.CLEAN, result.reason

    def test_steady_points_stay_clean(hz_family_server):
        server = hz_family_server("fakefam", "steady", make_target=fake, launches=4)
        for _ in range(3):
            assert server.run({{"rate": 0.0}}).outcome is Outcome.CLEAN
"""


def test_failing_point_gets_its_rate_and_replay_command(inner):
    inner.write("test_fam.py", FAMILY_TESTS)
    res = inner.run("--hypothesis-profile", "hazards-ci", "--hz-point-runs", "9")
    assert (res.outcomes["failed"], res.outcomes["passed"]) == (1, 1), res.stdout + res.stderr
    m = re.search(r"family fakefam, failing point: (\{.*\})", res.stdout)
    assert m, res.stdout
    point = json.loads(m.group(1))
    assert point["fail_every"] == 3 and point["variant"] == "flaky" and "salt" in point
    # The fake fails exactly every third request: 3 of 9 re-runs, whatever came before.
    assert f"rate at this point: 3/9 runs failed: {format_rate(3, 9)}; mismatch 3" in res.stdout
    assert f"replay: {repro_command('fakefam', point)}" in res.stdout
    # hypothesis prints the same replay line with its falsifying example (note()).
    assert "hazards: replay with `hazards repro --family fakefam --params" in res.stdout


def test_point_runs_zero_skips_the_remeasurement(inner):
    inner.write("test_fam.py", FAMILY_TESTS)
    res = inner.run("--hypothesis-profile", "hazards-ci", "--hz-point-runs", "0", "-k", "point_is_clean")
    assert res.outcomes["failed"] == 1 and "passed" not in res.outcomes
    assert "failing point" in res.stdout and "rate at this point" not in res.stdout


def test_repro_command_round_trips_the_point():
    point = {"variant": "broken_war", "stages": 1, "jitter": 4, "note": "it's"}
    line = repro_command("pipeline", point)
    argv = shlex.split(line)
    assert argv == repro_argv("pipeline", point)
    assert argv[:4] == ["hazards", "repro", "--family", "pipeline"] and argv[4] == "--params"
    assert json.loads(argv[5]) == point


def _result(outcome, **metrics):
    return RunResult(Outcome(outcome), "test", metrics=metrics)


def test_measure_point_counts_failures_and_excludes_errors():
    outcomes = iter(["clean", "mismatch", "hang", "error", "clean", "fault"])
    seen = []

    def run_point(p):
        seen.append(p)
        return _result(next(outcomes))

    rate = measure_point("fam", {"x": 1}, run_point, 6)
    assert (rate.failed, rate.n) == (3, 5)
    assert (rate.low, rate.high) == pytest.approx(rate_ci(3, 5))
    assert rate.counts["error"] == 1 and seen == [{"x": 1}] * 6
    assert "3/5 runs failed: 60% (95% CI" in rate.text() and "hang 1" in rate.text()
    note = failure_note("fam", {"x": 1}, rate)
    assert note.splitlines()[-1] == "replay: hazards repro --family fam --params '{\"x\":1}'"


def test_mismatch_rate_reads_the_reply_counts():
    assert mismatch_rate(_result("mismatch", launches=200, mismatched=50)) == 0.25
    assert mismatch_rate(_result("clean", launches=200, mismatched=0)) == 0.0
    assert mismatch_rate(_result("hang")) == 1.0
    assert mismatch_rate(_result("clean")) is None


def test_target_mismatch_rate_calls_hypothesis_target(monkeypatch):
    import hypothesis

    calls = []
    monkeypatch.setattr(hypothesis, "target", lambda value, label: calls.append((label, value)))
    assert target_mismatch_rate(_result("mismatch", launches=10, mismatched=3, max_rel_err=0.5)) == 0.3
    assert calls == [("mismatch rate", 0.3), ("max rel err", 0.5)]


def test_family_server_feeds_the_mismatch_rate_to_hypothesis_targeting(inner):
    # A point's mismatch rate, as the fake server reports it (mismatched / launches), is
    # what hypothesis' target phase maximises; its statistics show the best score found.
    inner.write("test_target.py", f"""
        import sys
        from hypothesis import HealthCheck, given, settings, strategies as st
        from hazards.engine.targets import ServerTarget

        def fake():
            return ServerTarget([sys.executable, {str(FAKE)!r}])

        # Outside the ci/nightly profiles, say that the shared warm server is intended; no
        # deadline: a request's round trip is timing noise on a loaded machine, not the subject.
        @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(x=st.integers(0, 10_000))
        def test_rate_climbs(hz_family_server, x):
            server = hz_family_server("fakefam", make_target=fake, launches=1000)
            rate = max(0.0, 1.0 - abs(x - 7_000) / 7_000)
            server.target_rate(server.run({{"rate": rate}}))
    """)
    res = inner.run("--hypothesis-show-statistics", "--hypothesis-seed", "1")
    assert res.ret == 0, res.stdout + res.stderr
    m = re.search(r"Highest target scores?:\s*\n?\s*([0-9.]+)\s+\(label='mismatch rate'\)", res.stdout)
    assert m, res.stdout
    assert float(m.group(1)) > 0.95
