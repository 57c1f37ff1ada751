"""The megakernel server's request handling, without a GPU: parameters are checked before
any kernel runs, and a device error ends the server after a `fault` reply."""
import pytest

from hazards.engine.protocol_server import StopServing
from hazards.ragged_decode.check import handle


class FakeChecker:
    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.calls = error, []

    def batch(self, calls: int, seed: int, mishandle: str, repeat: int = 1) -> dict:
        if self.error:
            raise self.error
        self.calls.append((calls, seed, mishandle, repeat))
        return {"launches": calls, "mismatched": 0, "max_rel_err": 0.001}


def test_a_request_runs_its_launches_with_its_seed_and_mishandling():
    checker = FakeChecker()
    reply = handle(checker, {"id": 7, "launches": 3, "params": {"seed": 11, "mishandle": "clamp8192"}})
    assert reply["status"] == "ok" and checker.calls == [(3, 11, "clamp8192", 1)]


def test_a_request_may_launch_each_drawn_input_several_times():
    checker = FakeChecker()
    reply = handle(checker, {"id": 7, "launches": 500, "params": {"repeat": 250}})
    assert reply["status"] == "ok" and checker.calls == [(500, 7, "none", 250)]


@pytest.mark.parametrize("params, says", [({"sede": 1}, "unknown params"), ({"mishandle": "sometimes"}, "known:"),
                                          ({"repeat": 0}, "repeat must be"), ({"repeat": "often"}, "repeat must be"),
                                          ({"repeat": 2.5}, "repeat must be"), ({"repeat": True}, "repeat must be")])
def test_bad_parameters_are_a_bad_request_and_run_nothing(params, says):
    checker = FakeChecker()
    reply = handle(checker, {"id": 1, "launches": 1, "params": params})
    assert reply["status"] == "bad_request" and says in reply["message"] and checker.calls == []


def test_a_device_error_replies_fault_and_stops_the_server():
    with pytest.raises(StopServing) as stop:
        handle(FakeChecker(RuntimeError("CUDA error: an illegal memory access")), {"id": 1, "launches": 1})
    assert stop.value.exit_code == 3 and stop.value.reply["status"] == "fault"
