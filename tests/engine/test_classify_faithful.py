"""FAITHFUL_RESULT lines (docs/protocol.md): every line counts; cos below the threshold is a
mismatch; a malformed line is an error, never skipped; a CommandTarget judges them."""
import json
import sys

import pytest

from hazards.engine.classify import classify_exit, faithful_problem, parse_result_lines
from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget

GOOD = {"task_id": 2, "task": "attend", "slowCTA_us": 310.5, "wall_us": 760.0, "sumCTA_us": 40000.0, "cos": 0.99991,
        "workers": 132, "shape": {"B": 128}, "build": "ragged_decode-prof-abc"}


def line(**over) -> str:
    return "FAITHFUL_RESULT " + json.dumps({**GOOD, **over})


def test_a_well_formed_line_with_good_cos_is_clean_and_kept_as_evidence():
    outcome, reason, ev = classify_exit(0, "log\n" + line() + "\n" + line(task_id=3, task="merge") + "\n")
    assert outcome is Outcome.CLEAN, reason
    assert [p["task_id"] for p in ev["faithful"]] == [2, 3]


def test_cos_below_the_default_threshold_is_a_mismatch_even_with_exit_0():
    # the example: today this was judged clean
    outcome, reason, ev = classify_exit(0, line() + "\n" + line(task_id=3, task="merge", cos=0.5) + "\n")
    assert outcome is Outcome.MISMATCH and ev["error_kind"] == "mismatch"
    assert "cos 0.5 < 0.99" in reason and "task 3 merge" in reason


def test_the_threshold_is_settable():
    text = line(cos=0.995) + "\n"
    assert classify_exit(0, text)[0] is Outcome.CLEAN
    assert classify_exit(0, text, faithful_cos_min=0.999)[0] is Outcome.MISMATCH
    assert classify_exit(0, line(cos=0.5) + "\n", faithful_cos_min=0.4)[0] is Outcome.CLEAN


@pytest.mark.parametrize("text,why", [
    ('FAITHFUL_RESULT {"cos": 0.995}', "missing key 'task_id'"),
    ("FAITHFUL_RESULT cos=0.5", "not JSON"),
    ("FAITHFUL_RESULT [1, 2]", "not a JSON object"),
    ("FAITHFUL_RESULT", "nothing after the tag"),
    (line(cos="0.99"), "'cos' has the wrong type"),
    (line(task_id=True), "'task_id' has the wrong type"),
    (line(workers=0), "'workers' is below 1"),
    (line(slowCTA_us=-1), "'slowCTA_us' is negative"),
    (line(cos=1.5), "outside [-1, 1]"),
    (line().replace('"build": "ragged_decode-prof-abc"', '"builds": 1'), "missing key 'build'"),
    ('FAITHFUL_RESULT {"task_id": 1, "task": "x", "slowCTA_us": NaN, "wall_us": 1, "sumCTA_us": 1, '
     '"cos": 1, "workers": 1, "shape": "s", "build": "b"}', "not finite"),
])
def test_a_malformed_line_is_an_error_not_clean(text, why):
    outcome, reason, ev = classify_exit(0, "ok\n" + line() + "\n" + text + "\n")
    assert outcome is Outcome.ERROR and ev["error_kind"] == "result_malformed", reason
    assert why in reason


def test_malformed_gives_way_to_exit_1_a_low_cos_and_a_fault():
    """A malformed line is an error only when nothing else says the run failed."""
    assert classify_exit(1, "FAITHFUL_RESULT {\n")[0] is Outcome.MISMATCH
    outcome, reason, _ = classify_exit(0, line(cos=0.1) + "\nFAITHFUL_RESULT {\n")
    assert outcome is Outcome.MISMATCH and "cos 0.1 < 0.99" in reason and "malformed" in reason
    assert classify_exit(3, "FAITHFUL_RESULT {\n")[0] is Outcome.FAULT


def test_a_line_counts_on_stderr_too_and_a_tag_inside_a_word_does_not():
    assert classify_exit(0, "", line(cos=0.2) + "\n")[0] is Outcome.MISMATCH
    assert classify_exit(0, "FAITHFUL_RESULTS are below\n")[0] is Outcome.CLEAN
    assert parse_result_lines("x FAITHFUL_RESULT {}\n") == ([], [])  # must start the line


def test_faithful_problem_accepts_the_documented_minimum():
    assert faithful_problem(dict(GOOD)) is None
    assert faithful_problem({**GOOD, "shape": "B=128", "extra": [1]}) is None


def test_a_command_target_judges_its_faithful_lines(tmp_path):
    def run(cos: float, **kw) -> Outcome:
        code = f"print({line(cos=cos)!r})"
        return CommandTarget([sys.executable, "-c", code], **kw).run(timeout=60).outcome

    assert run(0.9999) is Outcome.CLEAN
    assert run(0.5) is Outcome.MISMATCH
    assert run(0.5, faithful_cos_min=0.25) is Outcome.CLEAN
