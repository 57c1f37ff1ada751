"""stress/targets/sanitizer.py: compute-sanitizer reports become evidence and outcomes."""
from __future__ import annotations

from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.targets.sanitizer import judge, parse_report

RACE_LOG = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at pipeline_kernel+0x3c0 in pipeline.cu:70
=========     and Read access at pipeline_kernel+0x5a0 in pipeline.cu:102 [123456 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
CLEAN_LOG = """========= COMPUTE-SANITIZER
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""
MEMCHECK_LOG = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at bad_store+0x70
========= ERROR SUMMARY: 1 error
"""


def run(outcome=Outcome.CLEAN) -> RunResult:
    return RunResult(outcome=outcome, reason="result line: ok")


def test_racecheck_error_makes_a_clean_run_a_sanitizer_fault():
    rep = parse_report(RACE_LOG, "racecheck")
    assert rep["errors"] == 1 and rep["hazards"] == 123456 and rep["kinds"] == {"RAW": 1}
    r = judge(run(), rep)
    assert r.outcome is Outcome.FAULT and r.error_kind == "sanitizer_race"
    assert "racecheck: 1 error(s)" in r.reason and r.evidence["sanitizer"]["hazards"] == 123456


def test_a_clean_report_keeps_the_kernels_verdict():
    for outcome in (Outcome.CLEAN, Outcome.MISMATCH):
        r = judge(run(outcome), parse_report(CLEAN_LOG, "racecheck"))
        assert r.outcome is outcome and r.evidence["sanitizer"]["errors"] == 0


def test_memcheck_error_summary_is_counted():
    r = judge(run(), parse_report(MEMCHECK_LOG, "memcheck"))
    assert r.outcome is Outcome.FAULT and r.error_kind == "sanitizer_memcheck"


def test_a_clean_synccheck_or_memcheck_summary_is_zero_errors_not_an_error_line():
    """The whole synccheck log of a clean mma_pingpong run on the H200 (2026-12-01): its
    summary line starts like an error line and was once counted as one (every clean run a
    sanitizer fault)."""
    log = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
    for tool in ("synccheck", "memcheck"):
        rep = parse_report(log, tool)
        assert rep["errors"] == 0 and "first_error" not in rep
        assert judge(run(), rep).outcome is Outcome.CLEAN


def test_war_and_waw_are_named_from_the_access_order():
    log = ("========= Error: Race reported between Read access at a\n=========     and Write access at b [2 hazards]\n"
           "========= Error: Race reported between Write access at c\n=========     and Write access at d [3 hazards]\n")
    rep = parse_report(log, "racecheck")
    assert rep["kinds"] == {"WAR": 1, "WAW": 1} and rep["hazards"] == 5 and rep["errors"] == 2


def test_an_unsupported_device_is_an_error_not_clean():
    for text in ("========= Error: Device not supported\n", "Device not supported\n"):
        r = judge(run(), parse_report(text, "racecheck"))
        assert r.outcome is Outcome.ERROR and r.error_kind == "sanitizer_unavailable"


def test_a_real_h200_racecheck_report_of_broken_war_is_a_race_fault():
    """An excerpt (first error and the summary) of the report racecheck wrote on the H200 for
    pipeline/broken_war (2026-11-30, docs/results/families-h200.md)."""
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "racecheck_broken_war_h200.log").read_text()
    rep = parse_report(text, "racecheck")
    assert rep["errors"] == 12 and rep["warnings"] == 0  # from the RACECHECK SUMMARY line
    assert rep["hazards"] > 100000 and rep["kinds"].get("WAR", 0) >= 1
    assert "pipeline.cu:102" in rep["first_error"]
    assert judge(run(), rep).error_kind == "sanitizer_race"


FAKE_SANITIZER = '''#!/usr/bin/env python3
"""compute-sanitizer as far as SanitizerTarget sees it: writes RACE_LOG, runs the command."""
import os, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
command = args[args.index("--print-limit") + 2:]
with open(log, "w") as f:
    f.write(os.environ["FAKE_REPORT"])
os.execvp(command[0], command)
'''


def test_the_sanitizer_wraps_a_command_target_and_its_report_decides(tmp_path, monkeypatch):
    import sys

    import pytest

    from hazards.engine.errors import UserError
    from hazards.engine.targets import CommandTarget, ServerTarget, WrapperTarget
    from hazards.engine.targets.sanitizer import SanitizerTarget

    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(0o755)
    monkeypatch.setenv("HZ_COMPUTE_SANITIZER", str(fake))
    ok = [sys.executable, "-c", "print('HZ_RESULT {\"ok\": true}')"]
    inner = CommandTarget(ok, env={"FAKE_REPORT": RACE_LOG}, name="kernel")
    with SanitizerTarget(inner, "racecheck") as target:
        assert isinstance(target, WrapperTarget) and target.inner is inner
        r = target.run(timeout=20, artifact_dir=tmp_path / "run-1")
    assert r.outcome is Outcome.FAULT and r.error_kind == "sanitizer_race"
    assert r.target == "racecheck:" + inner.argv[0].rsplit("/", 1)[-1]
    assert (tmp_path / "run-1" / "racecheck.log").read_text() == RACE_LOG
    clean = SanitizerTarget(CommandTarget(ok, env={"FAKE_REPORT": CLEAN_LOG}), "racecheck", name="k[racecheck]")
    r = clean.run(timeout=20)  # no artifact folder: the log goes to a temporary one
    assert r.outcome is Outcome.CLEAN and r.evidence["sanitizer"]["errors"] == 0 and r.target == "k[racecheck]"
    with pytest.raises(UserError, match="wraps a command target"):
        SanitizerTarget(ServerTarget.__new__(ServerTarget), "racecheck")
