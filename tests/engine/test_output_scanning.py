"""Every byte of a child's output is scanned for fault messages and result lines, in
bounded memory, and the line that matched is kept in the evidence."""
import json
import re
import os
import subprocess
import sys

import pytest

from cli_helpers import REPO
from engine_fakes import fake_command
from hazards.engine.classify import NOTABLE_RE
from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget
from hazards.engine.watchdog import Drain


def _drain(data: bytes, notable_re=NOTABLE_RE, **kw) -> Drain:
    r, w = os.pipe()
    drain = Drain(r, name="t", notable_re=notable_re, **kw)
    drain.start()
    with os.fdopen(w, "wb") as f:
        f.write(data)
    drain.join(10)
    os.close(r)
    return drain


@pytest.mark.parametrize("code, expected", [(0, Outcome.FAULT), (1, Outcome.FAULT)])
def test_a_fault_message_inside_a_progress_bar_is_seen_after_64_kb_more_output(fake_env, code, expected):
    result = CommandTarget(fake_command("progress_bar", "fault", str(code)), env=fake_env).run(timeout=30)
    assert result.outcome is expected and result.error_kind == "illegal_address", result.reason
    assert "illegal memory access" not in result.evidence["stderr_tail"]  # it scrolled out
    assert "an illegal memory access was encountered" in result.evidence["fault_signature"]["line"]


def test_a_result_line_after_a_carriage_return_is_seen_after_64_kb_more_output(fake_env):
    result = CommandTarget(fake_command("progress_bar", "result"), env=fake_env).run(timeout=30)
    assert result.outcome is Outcome.MISMATCH, result.reason
    assert result.metrics == {"ok": False, "mismatched": 2}


@pytest.mark.parametrize("split", [1, 4096, 65535, 65536, 65537, 100_000])
def test_a_keyword_across_any_read_boundary_of_an_endless_line_is_found(split):
    message = b"CUDA error: an illegal memory access was encountered"
    body = b"x" * (split - 20) + message + b"y" * 300_000
    drain = _drain(body)
    kept = drain.text().splitlines()[0]
    assert "an illegal memory access was encountered" in kept and len(kept) < 2000


def test_kept_windows_of_an_endless_line_are_bounded_and_marked():
    body = b"a" * 10_000 + b" CUDA error: misaligned address " + b"b" * 10_000
    first = _drain(body).text().splitlines()[0]
    assert first.startswith("…") and "misaligned address" in first
    assert len(first) <= 1 + NOTABLE_RE.BEFORE + NOTABLE_RE.AFTER + len(NOTABLE_RE.TRUNCATED)


def test_a_result_line_is_kept_whole_and_an_overlong_one_is_marked_truncated():
    long_metrics = json.dumps({"ok": True, "notes": "z" * 5000})
    body = b"HZ_RESULT " + long_metrics.encode() + b"\n" + b"filler line\n" * 10_000
    assert ("HZ_RESULT " + long_metrics) in _drain(body, tail_bytes=1024).text().splitlines()
    huge = b"HZ_RESULT {\"ok\": true, \"notes\": \"" + b"z" * 200_000 + b"\"}\n"
    kept = [ln for ln in _drain(huge, tail_bytes=1024).text().splitlines() if ln.startswith("HZ_RESULT")]
    assert kept and kept[0].endswith(NOTABLE_RE.TRUNCATED)


def test_carriage_returns_end_lines_for_the_classifier_too():
    drain = _drain(b"10%|#    |\r" + b'HZ_RESULT {"ok": true}' + b"\r20%|##   |\n")
    assert 'HZ_RESULT {"ok": true}' in drain.text().splitlines()


SUPERVISOR = """
import json, resource, sys
from hazards.engine.targets import CommandTarget
argv = json.loads(sys.argv[1])
CommandTarget(argv[:-1] + ["0.01"]).run(timeout=60)  # warm: imports, threads, first allocations
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = CommandTarget(argv).run(timeout=120)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"outcome": result.outcome.value, "kind": result.error_kind,
                  "grew_kib": after - before, "line": result.evidence.get("fault_signature")}))
"""


def test_a_50_mb_output_does_not_raise_the_supervisors_memory(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", SUPERVISOR, json.dumps(fake_command("flood", "50"))],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["outcome"] == "fault" and out["kind"] == "misaligned_address"
    assert "misaligned address" in out["line"]["line"]
    assert out["grew_kib"] < 16 * 1024, out  # peak RSS: 50 MB went through, < 16 MB stayed


REGEX = r"max_err=(?P<max_err>\S+) FAIL"


@pytest.mark.parametrize("end", ["\n", "\r"])
def test_a_result_regex_match_is_seen_after_64_kb_more_output(end):
    # the match scrolls out of the tail; a progress bar may end it with a carriage return
    script = f"printf 'step 1\\rmax_err=0.25 FAIL{end!s}'; yes 'filler line' | head -c 300000"
    result = CommandTarget(["sh", "-c", script.replace("\r", "\\r").replace("\n", "\\n")],
                           result_regex=REGEX).run(timeout=30)
    assert result.outcome is Outcome.MISMATCH, result.reason
    assert result.evidence["regex_match"]["groups"] == {"max_err": "0.25"}
    assert "FAIL" not in result.evidence["stdout_tail"]  # it scrolled out


# the second one has a construct bytes patterns lack (\N{...}): searched another way
@pytest.mark.parametrize("regex", [REGEX, r"max_err=(?P<max_err>\S+) \N{LATIN CAPITAL LETTER F}AIL"])
def test_a_result_regex_match_inside_an_endless_line_is_found_at_any_read_boundary(regex):
    for split in (1, 65535, 65536, 100_000):
        body = b"x" * split + b" max_err=7 FAIL " + b"y" * 200_000
        kept = _drain(body, notable_re=NOTABLE_RE.with_pattern(regex)).text()
        assert re.search(regex, kept).group("max_err") == "7", split
