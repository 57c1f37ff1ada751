"""A result line the classifier cannot read, or whose fields have the wrong type, makes the
run `error` with a reason that quotes it; a server reply follows the same rules."""
import json
import re
import sys

import pytest

from engine_fakes import fake_command
from hazards.engine import protocol
from hazards.engine.classify import classify_exit, parse_result_lines
from hazards.engine.errors import ProtocolError
from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget

# (the text after the tag, what the reason must say) -- the examples first
MALFORMED = [
    ('{"ok": false, max_err: 3}', "not JSON"),
    ('{"ok":"false"}', 'ok is not true or false: "false"'),
    ('{"mismatched":"3"}', 'mismatched is not a non-negative integer: "3"'),
    ('{"status":"done"}', 'unknown status "done"'),
    ('{"mismatched": -1}', "mismatched is not a non-negative integer: -1"),
    ('{"ok": true, "mismatched": 1.5}', "mismatched is not a non-negative integer: 1.5"),
    ('{"ok": true, "max_rel_err": "0.3"}', 'max_rel_err is not a number: "0.3"'),
    ('{"ok": 1}', "ok is not true or false: 1"),
    ('{"status": "fault", "message": 7}', "message is not a string: 7"),
    ('{"ok": true, "metrics": [1]}', "metrics is not an object"),
    ('[{"ok": true}]', "not a JSON object"),
    ('"ok"', "not a JSON object"),
    ("", "nothing after the tag"),
    ('{"ok": true', "not JSON"),
]


@pytest.mark.parametrize("body, why", MALFORMED)
def test_a_malformed_result_line_is_an_error_quoting_the_line(body, why):
    line = f"HZ_RESULT {body}".strip()
    outcome, reason, evidence = classify_exit(0, f"work\n{line}\nbye\n", "")
    assert outcome is Outcome.ERROR and evidence["error_kind"] == "result_malformed"
    assert why in reason and repr(line) in reason, reason
    assert evidence["result_problems"][0] == reason


@pytest.mark.parametrize("tag", ["HZ_RESULT", "KERNEL_RESULT", "  HZ_RESULT:", "HZ_RESULT="])
def test_every_result_tag_and_separator_is_validated(tag):
    outcome, _, _ = classify_exit(0, f'{tag} {{"ok": "yes"}}\n')
    assert outcome is Outcome.ERROR


def test_a_malformed_line_on_stderr_counts_too_and_never_makes_a_run_clean():
    outcome, reason, _ = classify_exit(0, 'HZ_RESULT {"ok": true}\n', 'HZ_RESULT {"ok": "true"}\n')
    assert outcome is Outcome.ERROR and "ok is not true or false" in reason


def test_a_malformed_line_does_not_hide_stronger_evidence():
    bad = 'HZ_RESULT {"ok": "false"}\n'
    assert classify_exit(3, bad)[0] is Outcome.FAULT  # the exit code convention comes first
    assert classify_exit(0, bad, "CUDA error: misaligned address")[0] is Outcome.FAULT
    assert classify_exit(0, bad + 'HZ_RESULT {"status": "fault", "message": "x"}\n')[0] is Outcome.FAULT


def test_words_that_only_begin_like_a_tag_are_not_result_lines():
    outcome, _, evidence = classify_exit(0, "HZ_RESULTS are below\nsee HZ_RESULT {oops}\n")
    assert outcome is Outcome.CLEAN and "result_problems" not in evidence


def test_well_formed_lines_keep_their_verdicts_and_the_line_is_evidence():
    outcome, reason, evidence = classify_exit(0, 'HZ_RESULT {"ok": false, "mismatched": 2, "max_rel_err": null}\n')
    assert outcome is Outcome.MISMATCH and reason == "result line: ok=false"
    assert evidence["result"]["line"] == 'HZ_RESULT {"ok": false, "mismatched": 2, "max_rel_err": null}'
    good, problems = parse_result_lines('HZ_RESULT {"ok": true}\nHZ_RESULT {"ok": true}\n')
    assert len(good) == 1 and not problems  # a line read twice (kept and in the tail) counts once


@pytest.mark.parametrize("body, why", [(b, w) for b, w in MALFORMED if b.startswith("{") and "not JSON" not in w])
def test_a_server_reply_with_the_same_fields_is_a_protocol_error(body, why):
    reply = {"id": 7, "status": "ok", "mismatched": 0, **json.loads(body)}
    with pytest.raises(ProtocolError, match="reply " + why.split(":")[0]):
        protocol.validate_reply(reply, 7)


def test_a_program_printing_a_malformed_result_line_is_an_error_run(fake_env):
    result = CommandTarget(fake_command("print", 'HZ_RESULT {"ok": false, max_err: 3}'), env=fake_env).run(timeout=20)
    assert result.outcome is Outcome.ERROR and result.error_kind == "result_malformed"
    assert result.reason == "malformed HZ_RESULT line (not JSON): 'HZ_RESULT {\"ok\": false, max_err: 3}'"


# Concordant failure signals: a malformed line is an `error` only when
# nothing else says the run failed.
@pytest.mark.parametrize("code, text, why", [
    (1, 'KERNEL_RESULT {"status": "mismatch", "max_err": 0.4}', "exit code 1"),
    (0, 'KERNEL_RESULT {"status": "mismatch", "max_err": 0.4}', "'mismatch'"),
    (0, 'HZ_RESULT {"status": "FAILED"}', "'FAILED'"),
    (0, 'HZ_RESULT {"verdict": "wrong answer", "ok": "no"}', "'wrong'"),
    (0, "HZ_RESULT result incorrect at row 3", "'incorrect'"),
    (0, 'HZ_RESULT {"status": "fail"}', "'fail'"),
    (0, 'FAITHFUL_RESULT {"cos": 0.5}', "cos 0.5 < 0.99"),
    (1, 'HZ_RESULT {"ok": false, max_err: 3}', "exit code 1"),
])
def test_a_malformed_line_that_agrees_with_a_failure_is_a_mismatch_keeping_the_line(code, text, why):
    outcome, reason, evidence = classify_exit(code, f"work\n{text}\n", "")
    assert outcome is Outcome.MISMATCH and evidence["error_kind"] == "mismatch", reason
    assert why in reason and "malformed" in reason and repr(text) in reason, reason
    assert evidence["result_problems"][0].startswith("malformed ") and repr(text) in evidence["result_problems"][0]


@pytest.mark.parametrize("text", [
    'HZ_RESULT {"mismatched": "3"}',          # a key name is not a failure word
    'HZ_RESULT {"status": "done"}',
    'FAITHFUL_RESULT {"cos": 0.999}',          # cos at or above the threshold says nothing
    'FAITHFUL_RESULT {"cos": "0.5"}',          # a cos that is not a number says nothing either
    'HZ_RESULT {"failures": 0, "ok": 1}',       # words only as whole words
])
def test_a_malformed_line_with_no_failure_signal_stays_an_error(text):
    outcome, reason, evidence = classify_exit(0, text + "\n")
    assert outcome is Outcome.ERROR and evidence["error_kind"] == "result_malformed", reason


def test_a_failing_well_formed_line_or_regex_beside_a_malformed_one_is_a_mismatch():
    bad = 'HZ_RESULT {"ok": "false"}\n'
    outcome, reason, _ = classify_exit(0, 'HZ_RESULT {"ok": false}\n' + bad)
    assert outcome is Outcome.MISMATCH and "malformed" in reason
    outcome, _, _ = classify_exit(0, bad + "max err 0.7\n", result_regex=re.compile(r"max err 0\.[5-9]"))
    assert outcome is Outcome.MISMATCH


def test_a_program_exiting_1_with_an_unknown_status_is_a_counted_mismatch(fake_env):
    text = 'KERNEL_RESULT {"status": "mismatch", "max_err": 0.4}'
    program = [sys.executable, "-c", f"print({text!r}); raise SystemExit(1)"]
    result = CommandTarget(program, env=fake_env).run(timeout=20)
    assert result.outcome is Outcome.MISMATCH and result.error_kind == "mismatch", result.reason
    assert text in result.reason
