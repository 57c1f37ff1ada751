"""Stall detection: a run whose progress stops is a hang within its
stall window, long before its timeout; a slow run that keeps progressing never is."""
import time

from engine_fakes import SLACK_S, assert_none_running, fake_command, recorded_pids
from hazards.engine.outcome import Outcome
from hazards.engine.progress import LineScanner, Progress, bucket_upper_s, gap_bucket
from hazards.engine.targets import CommandTarget

STALL_S = 1.0
TIMEOUT_S = 600.0  # the backstop the acceptance names: a stall must not wait for it


def run_fake(fake_env, *args, stall=STALL_S, timeout=TIMEOUT_S):
    target = CommandTarget(fake_command("progress", *args), env=fake_env, grace_s=0.5)
    t0 = time.monotonic()
    result = target.run(timeout=timeout, stall=stall)
    return result, time.monotonic() - t0


def test_progress_lines_then_blocking_is_a_hang_within_the_stall_window(fake_env, pidfile):
    result, elapsed = run_fake(fake_env, "3", "0.1", "block")
    assert result.outcome is Outcome.HANG and result.error_kind == "stall", result.reason
    assert result.reason.startswith("no progress for 1.0 s (last: step 2 of 3)"), result.reason
    assert "ready" in result.evidence["stdout_tail"]  # it was blocked, not still starting
    # stall + 1 s from the last event, on top of the fake's own start-up and 3 steps
    assert result.duration_s < 0.3 + STALL_S + 1.0 + SLACK_S, result.duration_s
    assert elapsed < TIMEOUT_S / 10
    assert result.evidence["progress"]["events"] == 3
    assert_none_running(recorded_pids(pidfile))


def test_progress_file_touches_then_blocking_is_a_hang(fake_env):
    result, _ = run_fake(fake_env, "3", "0.1", "block", "file")
    assert result.outcome is Outcome.HANG and result.error_kind == "stall", result.reason
    assert "(last: step 2)" in result.reason


def test_slow_run_that_keeps_progressing_is_never_a_stall(fake_env):
    # each gap is half the window: slow, but never quiet for a whole window
    result, elapsed = run_fake(fake_env, "8", str(STALL_S / 2), "exit")
    assert result.outcome is Outcome.CLEAN, result.reason
    assert elapsed >= 8 * STALL_S / 2
    assert result.evidence["progress"]["events"] == 8


def test_a_run_that_never_shows_progress_has_only_the_timeout(fake_env):
    target = CommandTarget(fake_command("busy"), env=fake_env, grace_s=0.5)
    result = target.run(timeout=2.0, stall=0.2)
    assert result.outcome is Outcome.HANG and result.error_kind == "timeout", result.reason
    assert result.duration_s >= 2.0


def test_without_a_window_progress_is_only_recorded(fake_env):
    result, elapsed = run_fake(fake_env, "2", "0.1", "block", stall=None, timeout=2.0)
    assert result.error_kind == "timeout" and elapsed >= 2.0


def test_line_scanner_finds_tags_at_line_starts_across_reads():
    progress = Progress()
    scan = LineScanner(progress)
    scan.feed(b"HZ_PROGRESS first\nnoise HZ_PROGRESS not at a line start\n")
    assert progress.events == 1 and progress.last_label() == "first"
    scan.feed(b"abc\nHZ_PROG")
    scan.feed(b"RESS split\n")
    assert progress.events == 2 and progress.last_label() == "split"
    scan.feed(b"\rHZ_PROGRESS bar 3\r")
    assert progress.events == 3 and progress.last_label() == "bar 3"


def test_gap_histogram_buckets_bound_each_gap():
    for gap in (0.0005, 0.001, 0.0011, 0.05, 0.7, 3.0):
        k = gap_bucket(gap)
        assert gap <= bucket_upper_s(k) + 1e-12
        assert k == 0 or gap > bucket_upper_s(k - 1)


def test_server_request_that_hangs_after_progress_lines_is_a_stall_and_the_server_is_replaced(fake_env, pidfile):
    from engine_fakes import fake_server
    from hazards.engine.targets import ServerTarget

    with ServerTarget(fake_server(), env=fake_env, grace_s=0.5, handshake_timeout_s=30) as target:
        target.start()
        first = target.pid
        t0 = time.monotonic()
        result = target.run({"beats": 3, "beat_s": 0.05, "action": "hang"}, timeout=TIMEOUT_S, stall=STALL_S)
        assert result.outcome is Outcome.HANG and result.error_kind == "stall", result.reason
        assert result.reason.startswith("no progress for 1.0 s (last: launch 2)"), result.reason
        assert time.monotonic() - t0 < STALL_S + 1.0 + SLACK_S
        assert result.evidence["progress"]["events"] == 3
        # the next request gets a new server, and a slow one that keeps beating is clean
        slow = target.run({"beats": 6, "beat_s": STALL_S / 2}, timeout=TIMEOUT_S, stall=STALL_S)
        assert slow.outcome is Outcome.CLEAN, slow.reason
        assert target.pid != first and slow.evidence["progress"]["events"] == 6


def test_a_late_progress_line_of_an_earlier_request_is_not_progress():
    from hazards.engine import protocol

    line = protocol.encode(protocol.progress_request(7, "launch 3"))
    assert protocol.progress_of(line) == (7, "launch 3")
    assert protocol.progress_of(protocol.encode({"id": 7, "status": "ok", "mismatched": 0})) is None
    assert protocol.progress_of(b'{"id": 1, "status": "ok", "mismatched": 0, "metrics": {"progress": 1}}\n') is None
