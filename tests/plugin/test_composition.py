"""The plugin composes with what users already run: pytest-timeout, pytest-repeat,
pytest-flakefinder, hypothesis' example database."""
from __future__ import annotations

import re

import pytest

from hazards.engine.stats import format_rate

from test_repeat_rates import FLAKY_TESTS


def _rows(res, name: str) -> list[str]:
    """The rate-table rows of one test (lines with k/n and its name)."""
    return [line for line in res.lines_with(name) if re.search(r"\d+/\d+\s+failed", line)]


def test_a_global_pytest_timeout_shorter_than_hz_timeout_does_not_crash_the_session(inner):
    pytest.importorskip("pytest_timeout", reason="pytest-timeout is in the dev extra")
    inner.write("pytest.ini", "[pytest]\ntimeout = 1\n")
    inner.write("test_slow.py", """
        import time

        import pytest

        @pytest.mark.hz_timeout(30)
        def test_isolated_body_takes_longer_than_the_global_timeout():
            time.sleep(2.5)

        @pytest.mark.hz_timeout(1.5)
        def test_isolated_body_hangs():
            time.sleep(60)

        def test_plain_test_still_gets_the_global_timeout():
            time.sleep(2.5)

        def test_after_them():
            pass
    """)
    res = inner.run("-rA")
    out = res.stdout + res.stderr
    assert "INTERNALERROR" not in out, out
    assert res.outcomes == {"passed": 2, "failed": 2}, out
    assert "hz_timeout: test body still running after 1.5s" in out  # the hz_timeout limit governs its tests
    assert "FAILED test_slow.py::test_plain_test_still_gets_the_global_timeout" in out  # others keep the global one
    assert "Failed: Timeout (>1.0s) from pytest-timeout" in out


@pytest.mark.parametrize("repeat_args, source", [
    (["--count", "6"], "pytest-repeat --count 6"),
    (["--flake-finder", "--flake-runs", "6"], "flakefinder --flake-runs 6"),
])
def test_repetitions_of_other_plugins_count_as_attempts_of_one_test(inner, repeat_args, source):
    pytest.importorskip("pytest_repeat" if "--count" in repeat_args else "pytest_flakefinder",
                        reason="pytest-repeat and pytest-flakefinder are in the dev extra")
    inner.write("test_flaky.py", FLAKY_TESTS)
    res = inner.run(*repeat_args)
    assert res.outcomes == {"failed": 2, "passed": 10}, res.stdout + res.stderr
    assert f"hazards: failure rates ({source})" in res.stdout
    flaky = _rows(res, "test_every_third_call_fails")
    assert len(flaky) == 1 and flaky[0].startswith("FLAKY"), res.stdout  # one row, not one per repetition
    assert re.search(r"2/6\s+failed", flaky[0]) and format_rate(2, 6) in flaky[0]
    assert flaky[0].rstrip().endswith("test_flaky.py::test_every_third_call_fails")
    steady = _rows(res, "test_always_passes")
    assert len(steady) == 1 and "0/6" in steady[0]


def test_a_repeat_marker_counts_its_repetitions_and_keeps_other_parameters_apart(inner):
    pytest.importorskip("pytest_repeat", reason="pytest-repeat is in the dev extra")
    inner.write("test_marked.py", """
        import pytest

        @pytest.mark.repeat(4)
        @pytest.mark.parametrize("x", ["a", "b"])
        def test_x(x, __pytest_repeat_step_number):
            assert not (x == "b" and __pytest_repeat_step_number == 0)
    """)
    res = inner.run()
    assert res.outcomes == {"failed": 1, "passed": 7}, res.stdout + res.stderr
    assert [r.split()[0] for r in _rows(res, "test_marked.py::test_x[a]")] == ["0/4"]
    rows_b = _rows(res, "test_marked.py::test_x[b]")
    assert len(rows_b) == 1 and rows_b[0].startswith("FLAKY") and "1/4" in rows_b[0], res.stdout


def test_hz_repeat_with_another_repeater_is_a_usage_error(inner):
    pytest.importorskip("pytest_repeat", reason="pytest-repeat is in the dev extra")
    inner.write("test_ok.py", "def test_ok():\n    pass\n")
    res = inner.run("--hz-repeat", "3", "--count", "2")
    assert res.ret == 4, res.stdout + res.stderr
    assert "--hz-repeat and pytest-repeat --count 2 both repeat every test: give one" in res.stderr


# A deterministic bug that a single search rarely finds (it must climb to within 1000 of
# 777777 by hypothesis.target in 60 examples), but that the example database makes easy:
# each run saves its best examples and the next one climbs on from there. With the
# database on, repetitions pass until one run reaches the bug and then all fail, which the
# table used to read as "FLAKY 80%".
CLIMBING_BUG = """
    from hypothesis import given, settings, target, strategies as st

    @settings(max_examples=60)
    @given(st.integers(0, 10**6))
    def test_climbs_to_a_deterministic_bug(x):
        target(-float(abs(x - 777777)))
        assert abs(x - 777777) > 1000
"""


def test_repeating_a_hypothesis_test_does_not_call_a_deterministic_bug_flaky(inner):
    inner.write("test_climb.py", CLIMBING_BUG)
    res = inner.run("--hz-repeat", "15")
    out = res.stdout + res.stderr
    row = _rows(res, "test_climbs_to_a_deterministic_bug")
    assert len(row) == 1 and not row[0].startswith("FLAKY"), out
    assert "FLAKY" not in res.stdout and "flaky test(s)" not in res.stdout, out
    assert "hypothesis example database off while tests repeat (profile 'hazards-repeat'" in out, out
    assert not (inner.path / ".hypothesis" / "examples").exists()  # nothing saved for the next repetition to replay


def test_a_hypothesis_test_with_a_fixed_search_is_still_flaky_when_its_outcome_varies(inner):
    # Derandomized: every repetition runs the same examples, so a repetition that fails
    # where the others pass is flakiness of the code under test.
    inner.write("conftest.py", """
        import os
        from pathlib import Path

        def pytest_runtest_setup(item):
            Path(os.environ["HZ_TEST_OUT"]).write_text(str(item.callspec.params["hz_repeat_index"]))
    """)
    inner.write("test_fixed.py", """
        import os
        from pathlib import Path

        from hypothesis import given, settings, strategies as st

        @settings(derandomize=True, database=None, max_examples=5)
        @given(st.integers())
        def test_fails_in_the_second_repetition(x):
            assert Path(os.environ["HZ_TEST_OUT"]).read_text() != "1"
    """)
    res = inner.run("--hz-repeat", "3", env={"HZ_TEST_OUT": str(inner.path / "rep")})
    row = _rows(res, "test_fails_in_the_second_repetition")
    assert len(row) == 1 and row[0].startswith("FLAKY") and "1/3" in row[0], res.stdout + res.stderr
