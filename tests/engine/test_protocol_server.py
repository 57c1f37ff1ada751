"""`serve(handler, hello)`: the server side of the protocol for Python servers."""
import io
import json

from hazards.engine.protocol import validate_handshake, validate_reply
from hazards.engine.protocol_server import StopServing, serve


def run(handler, hello, *requests):
    """Serve `requests` (objects, or raw lines); the exit code and the lines written."""
    lines = [r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n" for r in requests]
    out = io.BytesIO()
    code = serve(handler, hello, stdin=io.BytesIO(b"".join(lines)), stdout=out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def ok(req):
    return {"status": "ok", "launches": req["launches"], "mismatched": 0}


def test_the_handshake_comes_first_and_every_reply_echoes_its_request_id():
    code, lines = run(ok, {"server": "t", "pid": 1}, {"id": 4, "launches": 2, "params": {}},
                      {"id": 9, "launches": 1, "params": {}})
    assert code == 0
    assert validate_handshake(lines[0]) == {"hz_protocol": 1, "server": "t", "pid": 1}
    assert [validate_reply(r, i)["launches"] for r, i in zip(lines[1:], (4, 9))] == [2, 1]


def test_a_quit_request_ends_the_server_before_later_requests():
    seen = []
    code, lines = run(lambda r: seen.append(r["id"]) or ok(r), {},
                      {"id": 1, "launches": 1}, {"id": 2, "cmd": "quit"}, {"id": 3, "launches": 1})
    assert code == 0 and seen == [1] and [line.get("id") for line in lines[1:]] == [1]


def test_stop_serving_sends_its_reply_then_returns_its_exit_code():
    def fault(req):
        raise StopServing(3, {"status": "fault", "message": "sticky"})

    code, lines = run(fault, {}, {"id": 5, "launches": 1}, {"id": 6, "launches": 1})
    assert code == 3 and lines[1:] == [{"id": 5, "status": "fault", "message": "sticky"}]


def test_a_handler_may_send_nothing_and_a_server_may_skip_the_handshake():
    code, lines = run(lambda r: None, None, {"id": 1, "launches": 1})
    assert code == 0 and lines == []
