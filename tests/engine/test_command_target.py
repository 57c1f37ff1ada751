"""The command target against fake programs: each judged correctly, quickly, leaving nothing.

Time bounds: a hang must be judged within timeout + 1 s (the engine's promise). Nothing here
adds slack for CI load beyond that second. Tests that need the fake to be fully started when
the watchdog fires (they assert its "ready" line) use HANG_TIMEOUT: a fake's python start-up
alone takes ~0.25 s of CPU here, and far longer in wall time on a loaded machine.
"""
import json
import time

import pytest

from engine_fakes import SLACK_S, assert_none_running, fake_command, recorded_pids, running
from hazards.engine.errors import UserError
from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget
from hazards.engine.watchdog import register_on_hang, unregister_on_hang

TIMEOUT = 1.0
HANG_TIMEOUT = 2.0


def run_fake(mode, fake_env, *args, timeout=TIMEOUT, grace_s=0.5, **kw):
    target = CommandTarget(fake_command(mode, *args), env=fake_env, grace_s=grace_s)
    t0 = time.monotonic()
    result = target.run(kw.pop("params", None), timeout=timeout, **kw)
    return result, time.monotonic() - t0


def test_passing_program_is_clean_and_gets_params_and_launches(fake_env, pidfile):
    result, _ = run_fake("pass", fake_env, params={"variant": "fixed", "n": 3}, launches=7)
    assert result.outcome is Outcome.CLEAN, result.reason
    assert result.error_kind is None
    assert result.metrics["params"] == {"variant": "fixed", "n": 3}
    assert result.metrics["launches"] == 7
    assert result.variant == "fixed"
    assert result.evidence["exit_code"] == 0 and result.evidence["survivors"] == []
    assert_none_running(recorded_pids(pidfile))


def test_busy_loop_hang_is_classified_and_process_group_killed(fake_env, pidfile):
    result, elapsed = run_fake("busy", fake_env, timeout=HANG_TIMEOUT)
    assert result.outcome is Outcome.HANG and result.error_kind == "timeout"
    assert "ready" in result.evidence["stdout_tail"]  # it really was running when killed
    assert elapsed < HANG_TIMEOUT + SLACK_S
    assert result.evidence["sigkill"] == []  # SIGTERM sufficed
    assert result.evidence["survivors"] == []
    pids = recorded_pids(pidfile)
    assert len(pids) == 1
    assert_none_running(pids)


def test_blocking_hang_with_hanging_child_kills_both(fake_env, pidfile):
    result, elapsed = run_fake("block_with_child", fake_env, timeout=HANG_TIMEOUT)
    assert result.outcome is Outcome.HANG
    assert "ready" in result.evidence["stdout_tail"]
    assert elapsed < HANG_TIMEOUT + SLACK_S
    pids = recorded_pids(pidfile)
    assert len(pids) == 2 and set(result.evidence["killed"]) >= pids
    assert result.evidence["survivors"] == []
    assert_none_running(pids)


@pytest.mark.parametrize("mode,timeout", [
    # The grandchild keeps the HZ_SUPERVISED_* marker: the /proc scan finds it.
    ("setsid_grandchild", 3.0),
    # It drops the marker and closes our pipes; only the psutil samples taken while its
    # parent was alive (1 s) still know it after it was reparented to init.
    ("setsid_grandchild_noenv", 4.0),
    # It drops the marker, its parent exits at once (before a sample can see it), but it
    # still holds the program's stdout/stderr pipe: found as a pipe holder.
    ("setsid_grandchild_pipe", 3.0),
])
def test_grandchild_that_called_setsid_is_found_and_killed(fake_env, pidfile, mode, timeout, without_cgroups):
    result, elapsed = run_fake(mode, fake_env, timeout=timeout)
    assert result.outcome is Outcome.HANG, result.reason
    assert "ready" in result.evidence["stdout_tail"]  # all three had started
    assert elapsed < timeout + SLACK_S
    pids = recorded_pids(pidfile)
    assert len(pids) == 3  # program, the setsid-ing child (exited by itself), grandchild
    assert len(set(result.evidence["killed"]) & pids) == 2
    assert result.evidence["survivors"] == []
    assert_none_running(pids)


def test_program_ignoring_sigterm_gets_sigkill_after_grace(fake_env, pidfile):
    result, elapsed = run_fake("ignore_sigterm", fake_env, timeout=HANG_TIMEOUT, grace_s=0.3)
    assert result.outcome is Outcome.HANG
    assert "ready" in result.evidence["stdout_tail"]  # SIGTERM was ignored by then
    assert result.evidence["sigkill"] == sorted(recorded_pids(pidfile))
    assert elapsed < HANG_TIMEOUT + 0.3 + SLACK_S
    assert_none_running(recorded_pids(pidfile))


def test_background_process_left_after_clean_exit_is_killed_and_reported(fake_env, pidfile):
    result, _ = run_fake("leftover", fake_env)
    assert result.outcome is Outcome.CLEAN
    pids = recorded_pids(pidfile)
    assert len(pids) == 2
    assert len(result.evidence["leftovers"]) == 1 and set(result.evidence["leftovers"]) < pids
    assert_none_running(pids)


@pytest.mark.parametrize("mode,kind,signame", [("segfault", "sigsegv", "SIGSEGV"),
                                                ("abort", "sigabrt", "SIGABRT")])
def test_crash_signal_is_a_fault_named_by_its_signal(fake_env, pidfile, mode, kind, signame):
    result, elapsed = run_fake(mode, fake_env)
    assert result.outcome is Outcome.FAULT
    assert result.error_kind == kind and result.evidence["signal"] == signame
    assert result.reason == f"killed by {signame}"
    assert elapsed < TIMEOUT + SLACK_S
    assert_none_running(recorded_pids(pidfile))


def test_cuda_fault_message_with_exit_1_is_a_fault_not_a_mismatch(fake_env, pidfile):
    result, _ = run_fake("cuda_fault", fake_env)
    assert result.outcome is Outcome.FAULT
    assert result.error_kind == "illegal_address"
    assert "illegal memory access" in result.reason
    assert "Traceback" in result.evidence["stderr_tail"]


def test_fault_line_that_scrolled_out_of_the_tail_is_still_found(fake_env):
    result, _ = run_fake("chatty_fault", fake_env, timeout=10.0)
    assert "misaligned address" not in result.evidence["stderr_tail"]
    assert result.outcome is Outcome.FAULT and result.error_kind == "misaligned_address"


def test_wrong_hz_result_is_a_mismatch_with_its_metrics(fake_env):
    result, _ = run_fake("wrong_result", fake_env)
    assert result.outcome is Outcome.MISMATCH
    assert result.reason == "result line: ok=false"
    assert result.metrics == {"ok": False, "mismatched": 3, "max_rel_err": 0.51}


@pytest.mark.parametrize("code,outcome", [("0", Outcome.CLEAN), ("1", Outcome.MISMATCH),
                                          ("2", Outcome.ERROR), ("3", Outcome.FAULT),
                                          ("4", Outcome.FAULT)])
def test_exit_code_convention(fake_env, code, outcome):
    assert run_fake("exit", fake_env, code)[0].outcome is outcome


def test_result_regex_marks_a_mismatch(fake_env):
    target = CommandTarget(fake_command("print", "max_err=0.25 FAIL"), env=fake_env,
                           result_regex=r"max_err=(?P<max_err>\S+) FAIL")
    result = target.run(timeout=TIMEOUT)
    assert result.outcome is Outcome.MISMATCH
    assert result.evidence["regex_match"]["groups"] == {"max_err": "0.25"}


def test_full_logs_go_to_the_artifact_dir(fake_env, tmp_path):
    art = tmp_path / "runs" / "1"
    result, _ = run_fake("chatty_fault", fake_env, timeout=10.0, artifact_dir=art)
    assert result.artifact_dir == str(art)
    log = (art / "stderr.log").read_text()
    assert log.startswith("CUDA error: misaligned address") and "filler line 19999" in log
    assert (art / "stdout.log").exists()


def test_unwritable_log_is_reported_and_does_not_stall_the_run(fake_env, tmp_path):
    art = tmp_path / "art"
    (art / "stderr.log").mkdir(parents=True)  # the log cannot be created
    result, elapsed = run_fake("chatty_fault", fake_env, timeout=10.0, artifact_dir=art)
    assert result.outcome is Outcome.FAULT and result.error_kind == "misaligned_address"
    assert "stderr.log" in result.evidence["log_errors"][0]
    assert elapsed < 10.0


def test_on_hang_collectors_see_the_live_child_and_their_errors_are_recorded(fake_env, pidfile):
    seen = {}

    def snapshot(ctx):
        seen["alive"] = running(ctx.pid)
        return {"pid": ctx.pid, "target": ctx.target, "marker": any(
            k.startswith("HZ_SUPERVISED_") for k in ctx.env)}

    def broken(ctx):
        raise RuntimeError("collector bug")

    register_on_hang(snapshot)
    register_on_hang(broken)
    try:
        result, elapsed = run_fake("busy", fake_env)
    finally:
        unregister_on_hang(snapshot)
        unregister_on_hang(broken)
    assert result.outcome is Outcome.HANG
    collected = result.evidence["collectors"]
    assert seen["alive"] is True
    assert collected[snapshot.__qualname__]["pid"] == result.evidence["pid"]
    assert collected[snapshot.__qualname__]["marker"] is True
    assert collected[broken.__qualname__] == {"error": "RuntimeError: collector bug"}
    assert elapsed < TIMEOUT + SLACK_S
    assert_none_running(recorded_pids(pidfile))


def test_collectors_are_not_called_for_runs_that_end_by_themselves(fake_env):
    calls = []
    register_on_hang(calls.append)
    try:
        result, _ = run_fake("pass", fake_env)
    finally:
        unregister_on_hang(calls.append)
    assert result.outcome is Outcome.CLEAN and calls == [] and "collectors" not in result.evidence


def test_result_is_json_serialisable(fake_env):
    result, _ = run_fake("busy", fake_env)
    json.dumps(result.to_json())


@pytest.mark.parametrize("argv,message", [
    ([], "empty command"),
    ([""], "empty command"),
    (["/nonexistent/prog"], "command not found: /nonexistent/prog"),
    (["no-such-program-hz"], "command not found on PATH: no-such-program-hz"),
    ("echo hi", "not a string"),
])
def test_bad_command_is_a_one_line_user_error(argv, message):
    with pytest.raises(UserError) as err:
        CommandTarget(argv)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "soon"])
def test_bad_timeout_is_a_user_error_before_anything_starts(fake_env, pidfile, timeout):
    target = CommandTarget(fake_command("pass"), env=fake_env)
    with pytest.raises(UserError, match="timeout"):
        target.run(timeout=timeout)
    assert not pidfile.exists()


def test_bad_cwd_and_bad_regex_are_user_errors():
    with pytest.raises(UserError, match="working directory"):
        CommandTarget(["true"], cwd="/nonexistent/dir")
    with pytest.raises(UserError, match="bad result regex"):
        CommandTarget(["true"], result_regex="(unclosed")
