"""The server target against fake servers: protocol, judgement, respawn, nothing left behind.

Time bounds: a hang must be judged within timeout + 1 s (the engine's promise), with no extra
slack.
"""
import time

import pytest

from engine_fakes import SLACK_S, assert_none_running, fake_server, recorded_pids, running
from hazards.engine import protocol
from hazards.engine.errors import ProtocolError, UserError
from hazards.engine.outcome import Outcome
from hazards.engine.targets import ServerTarget
from hazards.engine.watchdog import register_on_hang, unregister_on_hang

TIMEOUT = 1.0


@pytest.fixture
def server(fake_env, pidfile):
    """A fake server target; on teardown, proves every process it ever started is gone."""
    target = ServerTarget(fake_server(), env=fake_env, grace_s=0.5, handshake_timeout_s=10)
    yield target
    target.close()
    assert_none_running(recorded_pids(pidfile))


def timed_run(target, params=None, timeout=TIMEOUT, **kw):
    t0 = time.monotonic()
    result = target.run(params, timeout=timeout, **kw)
    return result, time.monotonic() - t0


def test_correct_server_serves_many_requests_in_one_warm_process(server):
    results = [server.run({"variant": "ref"}, timeout=TIMEOUT, launches=10) for _ in range(4)]
    assert [r.outcome for r in results] == [Outcome.CLEAN] * 4
    assert [r.worker_age for r in results] == [0, 1, 2, 3]
    assert {r.metrics["worker_pid"] for r in results} == {server.pid}
    assert server.spawns == 1 and server.worker_age == 4
    assert server.gpu_uuid.startswith("GPU-fake-") and server.gpu_uuid == results[0].gpu_uuid
    assert results[0].metrics["launches"] == 10 and results[0].variant == "ref"
    assert server.handshake["server"] == "fake"


def test_mismatched_launches_are_a_mismatch_and_keep_the_server(server):
    result = server.run({"mismatched": 3}, timeout=TIMEOUT, launches=5)
    assert result.outcome is Outcome.MISMATCH and result.reason == "3 of 5 launches mismatched"
    assert result.metrics["mismatched"] == 3
    pid = server.pid
    assert server.run(timeout=TIMEOUT).outcome is Outcome.CLEAN and server.pid == pid


@pytest.mark.parametrize("action,expected_reason", [
    ("garbage", "protocol error: not JSON"),
    ("wrong_id", "protocol error: reply id"),
    ("truncate", "protocol error: truncated line"),
])
def test_garbage_reply_is_a_protocol_error_and_the_server_is_respawned(
        server, pidfile, action, expected_reason):
    server.run(timeout=TIMEOUT)
    first_pid = server.pid
    result, elapsed = timed_run(server, {"action": action})
    assert result.outcome is Outcome.ERROR and result.error_kind == "protocol"
    assert result.reason.startswith(expected_reason), result.reason
    assert elapsed < TIMEOUT + SLACK_S
    assert server.pid is None and not running(first_pid)
    after = server.run(timeout=TIMEOUT)
    assert after.outcome is Outcome.CLEAN and after.worker_age == 0
    assert server.pid != first_pid and server.spawns == 2


@pytest.mark.parametrize("action,kind,words", [
    ("die_segv", "sigsegv", "server died mid-request: killed by SIGSEGV"),
    ("die_cuda", "illegal_address", "an illegal memory access was encountered"),
])
def test_server_dying_mid_request_is_a_fault_and_is_respawned(server, action, kind, words):
    server.run(timeout=TIMEOUT)
    first_pid = server.pid
    result, elapsed = timed_run(server, {"action": action})
    assert result.outcome is Outcome.FAULT and result.error_kind == kind
    assert words in result.reason
    assert elapsed < TIMEOUT + SLACK_S
    assert not running(first_pid)
    assert server.run(timeout=TIMEOUT).outcome is Outcome.CLEAN and server.pid != first_pid


@pytest.mark.parametrize("action, outcome, kind, words", [
    ("abort_after", Outcome.FAULT, "sigabrt", "server died between requests: killed by SIGABRT"),
    ("exit0_after", Outcome.ERROR, "server_exited", "never ran"),  # a clean quit: the request never ran
])
def test_server_ending_after_its_reply_is_reported_at_the_next_request(server, action, outcome, kind, words):
    assert server.run({"action": action}, timeout=TIMEOUT).outcome is Outcome.CLEAN
    first_pid = server.pid
    deadline = time.monotonic() + 5
    while running(first_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    result = server.run(timeout=TIMEOUT)
    assert result.outcome is outcome and result.error_kind == kind
    assert words in result.reason
    assert server.run(timeout=TIMEOUT).outcome is Outcome.CLEAN and server.pid != first_pid


def test_a_server_quitting_right_after_its_reply_never_makes_the_racing_request_a_fault(server):
    # No wait for the server to die: the next request races its exit.
    outcomes = []
    for _ in range(12):
        assert server.run({"action": "exit0_after"}, timeout=TIMEOUT).outcome is Outcome.CLEAN
        result = server.run(timeout=TIMEOUT)
        outcomes.append((result.outcome, result.error_kind))
        assert server.run(timeout=TIMEOUT).outcome is Outcome.CLEAN
    assert set(outcomes) == {(Outcome.ERROR, "server_exited")}, outcomes


def test_a_server_crashing_right_after_its_reply_is_reported_between_requests(server):
    for _ in range(4):
        assert server.run({"action": "abort_after"}, timeout=TIMEOUT).outcome is Outcome.CLEAN
        result = server.run(timeout=TIMEOUT)
        assert result.outcome is Outcome.FAULT and result.error_kind == "sigabrt"
        assert result.reason == "server died between requests: killed by SIGABRT"


def test_fault_reply_is_a_fault_and_the_poisoned_server_is_replaced(server):
    server.run(timeout=TIMEOUT)
    first_pid = server.pid
    result = server.run({"action": "fault"}, timeout=TIMEOUT)
    assert result.outcome is Outcome.FAULT and result.error_kind == "illegal_address"
    assert not running(first_pid) and server.pid is None
    assert server.run(timeout=TIMEOUT).worker_age == 0


def test_bad_request_reply_is_an_error_and_keeps_the_server(server):
    server.run(timeout=TIMEOUT)
    pid = server.pid
    result = server.run({"action": "bad_request"}, timeout=TIMEOUT)
    assert result.outcome is Outcome.ERROR and result.error_kind == "bad_request"
    assert server.pid == pid


def test_hang_on_one_request_is_killed_collected_and_next_request_gets_a_new_server(
        server, pidfile, tmp_path):
    server.run(timeout=TIMEOUT)
    first_pid = server.pid
    contexts = []

    def collector(ctx):
        contexts.append((ctx.pid, running(ctx.pid)))
        return {"seen": ctx.pid}

    register_on_hang(collector)
    try:
        result, elapsed = timed_run(server, {"action": "hang"}, artifact_dir=tmp_path / "a")
    finally:
        unregister_on_hang(collector)
    assert result.outcome is Outcome.HANG and result.error_kind == "timeout"
    assert result.reason == f"no reply within {TIMEOUT:g}s"
    assert elapsed < TIMEOUT + SLACK_S
    assert contexts == [(first_pid, True)]
    assert result.evidence["collectors"][collector.__qualname__] == {"seen": first_pid}
    assert result.evidence["survivors"] == [] and not running(first_pid)
    assert (tmp_path / "a" / "request.json").read_bytes().startswith(b'{"id":')
    after = server.run(timeout=TIMEOUT)
    assert after.outcome is Outcome.CLEAN and server.pid != first_pid


def test_respawn_every_n_requests_recycles_the_worker(fake_env, pidfile):
    with ServerTarget(fake_server(), env=fake_env, respawn_every=2, grace_s=0.5) as target:
        results = [target.run(timeout=TIMEOUT) for _ in range(5)]
        assert [r.worker_age for r in results] == [0, 1, 0, 1, 0]
        pids = [r.metrics["worker_pid"] for r in results]
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
        assert not running(pids[0]) and not running(pids[2])
        assert target.spawns == 3
    assert_none_running(recorded_pids(pidfile))


def test_banner_lines_before_the_handshake_are_ignored(fake_env):
    with ServerTarget(fake_server("--handshake", "banner"), env=fake_env) as target:
        assert target.run(timeout=TIMEOUT).outcome is Outcome.CLEAN


@pytest.mark.parametrize("mode,message", [
    ("bad_version", "server speaks hz_protocol 99"),
    ("garbage", "protocol error in handshake: not JSON"),
    ("truncated", "protocol error: truncated handshake line"),
    ("crash", "exited with code 1 before its handshake: ModuleNotFoundError"),
])
def test_unusable_first_server_is_a_one_line_user_error(fake_env, pidfile, mode, message):
    target = ServerTarget(fake_server("--handshake", mode), env=fake_env, grace_s=0.5)
    with pytest.raises(UserError) as err:
        target.run(timeout=TIMEOUT)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert_none_running(recorded_pids(pidfile))


def test_handshake_timeout_is_its_own_error(fake_env, pidfile):
    target = ServerTarget(fake_server("--handshake", "silent"), env=fake_env, grace_s=0.5,
                          handshake_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(UserError, match="handshake timeout: no hz_protocol line within 1s"):
        target.start()
    assert time.monotonic() - t0 < 1.0 + SLACK_S
    assert_none_running(recorded_pids(pidfile))


def test_failed_handshake_of_a_respawned_server_is_an_error_run(fake_env, pidfile, tmp_path):
    mode = tmp_path / "mode"
    mode.write_text("ok")
    with ServerTarget(fake_server("--handshake-from", str(mode)), env=fake_env, grace_s=0.5,
                      handshake_timeout_s=1.0) as target:
        assert target.run(timeout=TIMEOUT).outcome is Outcome.CLEAN
        assert target.run({"action": "die_segv"}, timeout=TIMEOUT).outcome is Outcome.FAULT
        mode.write_text("silent")
        result = target.run(timeout=TIMEOUT)
        assert result.outcome is Outcome.ERROR and result.error_kind == "handshake_timeout"
        mode.write_text("ok")
        assert target.run(timeout=TIMEOUT).outcome is Outcome.CLEAN
    assert_none_running(recorded_pids(pidfile))


def test_close_asks_the_server_to_quit_and_leaves_nothing(fake_env, pidfile):
    target = ServerTarget(fake_server(), env=fake_env, grace_s=30.0)
    target.run(timeout=TIMEOUT)
    t0 = time.monotonic()
    target.close()
    assert time.monotonic() - t0 < SLACK_S  # quit was honoured: no 30 s SIGTERM grace was needed
    assert target.pid is None
    assert_none_running(recorded_pids(pidfile))


def test_bad_inputs_are_user_errors(fake_env):
    with pytest.raises(UserError, match="respawn_every"):
        ServerTarget(fake_server(), respawn_every=-1)
    with pytest.raises(UserError, match="command not found"):
        ServerTarget(["/nonexistent/server"])
    target = ServerTarget(fake_server(), env=fake_env)
    with pytest.raises(UserError, match="timeout"):
        target.run(timeout=-1)
    with pytest.raises(UserError, match="launches"):
        target.run(timeout=1, launches=0)
    assert target.pid is None  # nothing was started for bad input


# -- the protocol module ---------------------------------------------------------------

def test_protocol_lines_round_trip():
    line = protocol.encode(protocol.request(7, 100, {"variant": "fixed"}))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.decode(line) == {"id": 7, "launches": 100, "params": {"variant": "fixed"}}


@pytest.mark.parametrize("raw,message", [
    (b"not json\n", "not JSON"), (b"[1, 2]\n", "not a JSON object"),
    (b"\xff\xfe{}\n", "not"), (b"{" + b" " * protocol.MAX_LINE_BYTES + b"}", "exceeds"),
])
def test_protocol_decode_rejects_garbage(raw, message):
    with pytest.raises(ProtocolError, match=message):
        protocol.decode(raw)


def test_protocol_handshake_validation():
    assert protocol.validate_handshake({"hz_protocol": 1})["hz_protocol"] == 1
    for bad in ({}, {"hz_protocol": "1"}, {"hz_protocol": 2}, {"hz_protocol": 1, "gpu_uuid": 5}):
        with pytest.raises(ProtocolError):
            protocol.validate_handshake(bad)


@pytest.mark.parametrize("reply", [
    {"id": 2, "status": "ok", "mismatched": 0},   # wrong id
    {"id": 1},                                     # no status
    {"id": 1, "status": "great"},                  # unknown status
    {"id": 1, "status": "ok"},                     # ok without mismatched
    {"id": 1, "status": "ok", "mismatched": -1},
    {"id": 1, "status": "ok", "mismatched": 0, "kernel_ms": "fast"},
    {"id": 1, "status": "ok", "mismatched": 0, "metrics": [1]},
    {"id": True, "status": "ok", "mismatched": 0},
])
def test_protocol_reply_validation_rejects(reply):
    with pytest.raises(ProtocolError):
        protocol.validate_reply(reply, 1)
