"""Hangs inside tests are handled out of process: hz_timeout and hz_run_out_of_process."""
from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from hazards.pytest_plugin.isolation import OutOfProcessFailure, run_out_of_process
from hazards.engine.outcome import Outcome

HANGING_TESTS = """
    import os, threading, time
    from pathlib import Path

    import pytest

    PIDS = Path(os.environ["HZ_TEST_OUT"])

    @pytest.mark.hz_timeout(1.5)
    def test_hangs_with_a_hanging_grandchild():
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        PIDS.write_text(f"{os.getpid()} {child.pid}")
        threading.Event().wait()  # blocks in C, like a GIL-released CUDA synchronize

    @pytest.mark.hz_timeout(30)
    def test_passes_in_the_child(hz_gpu):
        assert os.environ["HZ_PYTEST_CHILD"] == "1"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == hz_gpu

    @pytest.mark.hz_timeout(30)
    def test_fails_in_the_child():
        assert 1 + 1 == 3

    def test_runs_in_process():
        assert "HZ_PYTEST_CHILD" not in os.environ
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_hz_timeout_fails_a_hanging_test_as_hang_and_kills_its_process_group(inner):
    inner.write("test_hang.py", HANGING_TESTS)
    pids = inner.path / "pids"
    t0 = time.monotonic()
    res = inner.run("-rA", env={"HZ_TEST_OUT": str(pids), "HZ_FAKE_GPUS": "0"})
    elapsed = time.monotonic() - t0
    assert res.outcomes == {"failed": 2, "passed": 2}, res.stdout + res.stderr
    assert "hz_timeout: test body still running after 1.5s" in res.stdout
    assert "timed out after 1.5s in the test's call phase" in res.stdout
    assert "killed process group" in res.stdout
    assert "assert (1 + 1) == 3" in res.stdout  # the child's own failure report, replayed
    test_pid, grandchild = map(int, pids.read_text().split())
    assert _gone(test_pid) and _gone(grandchild)
    assert elapsed < 120


@pytest.mark.parametrize("repeat_args, index", [(["--hz-repeat", "3"], "hz_repeat_index"),
                                                (["--count", "3"], "__pytest_repeat_step_number")],
                         ids=["hz-repeat", "pytest-repeat"])
def test_hz_timeout_repetitions_run_in_their_own_children_and_count_in_the_rate(inner, repeat_args, index):
    if index.startswith("__pytest_repeat"):
        pytest.importorskip("pytest_repeat", reason="pytest-repeat is in the dev extra")
    inner.write("test_rep.py", f"""
        import os
        import pytest

        @pytest.mark.hz_timeout(30)
        def test_fails_on_the_second_repetition({index}):
            assert os.environ["HZ_PYTEST_CHILD"] == "1"
            assert {index} != 1
    """)
    res = inner.run(*repeat_args)  # the child collects the same repetitions as its parent
    assert res.outcomes == {"failed": 1, "passed": 2}, res.stdout + res.stderr
    assert any(line.startswith("FLAKY") and "1/3" in line for line in res.stdout.splitlines()), res.stdout


def test_hz_timeout_rejects_a_bad_limit(inner):
    inner.write("test_bad.py", """
        import pytest

        @pytest.mark.hz_timeout(-1)
        def test_x():
            pass
    """)
    res = inner.run()
    assert res.ret != 0
    assert "hz_timeout: seconds must be > 0" in res.stdout + res.stderr


# Module-level so the child can unpickle them by reference.
def add(a, b):
    return a + b


def block_forever(pid_file):
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    signal.sigwait([signal.SIGUSR1])  # blocks in C with the GIL released


def wrong_answer():
    assert 2 + 2 == 5, "wrong answer from the device"


def die_by_signal():
    os.kill(os.getpid(), signal.SIGSEGV)


def test_out_of_process_returns_the_callables_value():
    assert run_out_of_process(add, 10, args=(2,), kwargs={"b": 40}) == 42


def test_out_of_process_hang_is_killed_and_reported_as_hang(tmp_path):
    pid_file = tmp_path / "pid"
    t0 = time.monotonic()
    with pytest.raises(OutOfProcessFailure) as info:  # 6 s: room for the child's start on a busy machine
        run_out_of_process(block_forever, 6.0, args=(str(pid_file),))
    assert time.monotonic() - t0 < 6.0 + 5.0
    assert info.value.result.outcome is Outcome.HANG
    assert "hang: timed out after 6s" in str(info.value)
    assert _gone(int(pid_file.read_text()))


def test_out_of_process_classifies_assertion_as_mismatch_and_signal_as_fault():
    result, value = run_out_of_process(wrong_answer, 10, check=False)
    assert result.outcome is Outcome.MISMATCH and value is None
    assert "wrong answer from the device" in result.evidence["stderr_tail"]
    with pytest.raises(OutOfProcessFailure) as info:
        run_out_of_process(die_by_signal, 10)
    assert info.value.result.outcome is Outcome.FAULT and "SIGSEGV" in info.value.result.reason


def test_out_of_process_runs_an_argv_command():
    result = run_out_of_process([sys.executable, "-c", "import sys; sys.exit(3)"], 10, check=False)
    assert result.outcome is Outcome.FAULT  # exit 3: device error, by the exit-code convention
    assert run_out_of_process([sys.executable, "-c", "pass"], 10) is None


def test_hz_timeout_fails_a_test_whose_child_hangs_after_its_teardown(inner):
    inner.write("test_exit_hang.py", """
        import threading

        import pytest

        @pytest.mark.hz_timeout(30, startup=15)
        def test_passes_then_blocks_the_exit():
            # A non-daemon thread keeps the interpreter from exiting, as a spinning kernel
            # keeps a CUDA context from being torn down.
            threading.Thread(target=threading.Event().wait).start()
    """)
    t0 = time.monotonic()
    res = inner.run("-rA")
    assert res.outcomes.get("passed") == 1 and res.outcomes.get("errors") == 1, res.stdout + res.stderr
    assert "did not exit within 15s after the test's teardown" in res.stdout
    assert time.monotonic() - t0 < 120
