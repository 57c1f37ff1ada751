"""The megakernel as an engine target (`python3 -m hazards.ragged_decode.check`): the exit-code
convention and HZ_RESULT on a command target, the JSON-lines protocol on a server target,
and its canaries (the ragged-decode contract's known-bad mishandlings) detected."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget, ServerTarget

REPO = Path(__file__).resolve().parents[2]
CHECK = [sys.executable, "-m", "hazards.ragged_decode.check"]
torch = pytest.importorskip("torch", reason="the megakernel check needs torch (dev extra: torch==2.13.0)")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CHECK, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_bad_arguments_are_one_line_and_exit_2():
    for args in (("--calls", "0"), ("--lens-scale", "0"), ("--mishandle", "sometimes"), ("--repeat", "0")):
        r = _run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, args


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_the_check_is_an_error_not_a_fault():
    r = _run("--calls", "1")
    assert r.returncode == 2 and "no CUDA-capable device" in r.stderr and "Traceback" not in r.stderr
    result = CommandTarget([*CHECK, "--calls", "1"], cwd=REPO).run(timeout=120)
    assert result.outcome is Outcome.ERROR


@pytest.mark.gpu
def test_command_target_is_clean_and_a_mishandled_batch_is_a_mismatch():
    ok = CommandTarget([*CHECK, "--calls", "2", "--lens-scale", "8"], cwd=REPO).run(timeout=300)
    assert ok.outcome is Outcome.CLEAN, ok.reason
    bad = CommandTarget([*CHECK, "--calls", "2", "--lens-scale", "8", "--mishandle", "clamp8192"],
                        cwd=REPO).run(timeout=300)
    assert bad.outcome is Outcome.MISMATCH, bad.reason


@pytest.mark.gpu
def test_server_target_checks_every_call_and_catches_each_mishandling():
    with ServerTarget([*CHECK, "--serve"], cwd=REPO, handshake_timeout_s=300) as server:
        clean = server.run({"seed": 1}, timeout=300, launches=3)
        assert clean.outcome is Outcome.CLEAN, clean.reason
        assert clean.metrics["launches"] == 3 and clean.metrics["max_rel_err"] < 1e-2
        for bad in ("clamp8192", "ignore_starts"):
            r = server.run({"seed": 2, "mishandle": bad}, timeout=300, launches=2)
            assert r.outcome is Outcome.MISMATCH and r.metrics["mismatched"] == 2, (bad, r.reason)
            assert r.metrics["max_rel_err"] > 1e-2
        assert server.run({"mishandle": "sometimes"}, timeout=60).outcome is Outcome.ERROR
        assert server.worker_age >= 3  # one warm process served every request


@pytest.mark.gpu
def test_server_repeats_a_draw_with_one_reference_and_still_checks_every_launch():
    with ServerTarget([*CHECK, "--serve"], cwd=REPO, handshake_timeout_s=300) as server:
        clean = server.run({"seed": 1, "repeat": 4}, timeout=300, launches=8)
        assert clean.outcome is Outcome.CLEAN, clean.reason
        assert clean.metrics["launches"] == 8 and clean.metrics["draws"] == 2
        bad = server.run({"seed": 2, "mishandle": "clamp8192", "repeat": 3}, timeout=300, launches=6)
        assert bad.outcome is Outcome.MISMATCH and bad.metrics["mismatched"] == 6, bad.reason
