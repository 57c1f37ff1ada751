"""The megakernel check's batch loop on the CPU (the kernel a stand-in, the arena and the torch
reference real): `repeat` launches each drawn input several times with its reference computed
once, every launch is still poisoned, compared and reported as progress, and a request's first
call is within the stall window (a `started` beat before it)."""
from __future__ import annotations

import argparse
import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from hazards.ragged_decode import check, kernel, reference  # noqa: E402

LENS = [6, 4, 3, 3, 1]  # a tiny arena at the contract's heads: the torch reference is cheap on a CPU


class NoTiming:
    """torch.cuda.Event's stand-in on a CPU build (the loop times the kernel with events)."""

    def __init__(self, **_: object) -> None:
        pass

    def record(self) -> None:
        pass

    def elapsed_time(self, _: "NoTiming") -> float:
        return 0.0


@pytest.fixture
def cpu(monkeypatch):
    """Patch the CUDA-only pieces; `cpu.kernel` says what each launch (0-based) does."""
    state = SimpleNamespace(launch_q=[], references=0, heartbeats=[], skip=set(), wrong=set(), flag_at=None)
    right: dict = {}  # the stand-in kernel's answer per drawn input (the draw's tensors stay alive)
    real_reference = reference.reference_decode
    real_arena = reference.make_arena

    def counted_reference(*args):
        state.references += 1
        return real_reference(*args)

    def fake_launch(handle, q, starts, lens, *, out):
        n = len(state.launch_q)
        state.launch_q.append(q.clone())
        if n == state.flag_at:
            handle.counters[kernel.ERROR_WORD] |= 1
        if n in state.skip:  # writes nothing: the poisoned output stays
            return out
        if id(q) not in right:
            right[id(q)] = (q, real_reference(q, handle.k, handle.v, starts, lens).float())
        out.copy_(right[id(q)][1])
        if n in state.wrong:
            out.mul_(1.5)
        return out

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", NoTiming)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(reference, "make_arena", lambda *a, device, **kw: real_arena(*a, device="cpu", **kw))
    monkeypatch.setattr(reference, "reference_decode", counted_reference)
    monkeypatch.setattr(kernel, "build_sched", lambda w, kv, cfg, m, **kw: SimpleNamespace(
        k=kv["k"], v=kv["v"], counters=torch.zeros(3, dtype=torch.int32)))
    monkeypatch.setattr(kernel, "ragged_decode", fake_launch)
    monkeypatch.setattr(check, "progress", state.heartbeats.append)
    state.checker = check.Checker(lens=LENS)
    return state


def test_a_repeated_input_has_its_reference_computed_once_per_draw(cpu):
    res = cpu.checker.batch(6, seed=3, repeat=3)
    assert cpu.references == 2 and res["metrics"]["draws"] == 2
    assert res["launches"] == 6 and res["mismatched"] == 0 and res["max_rel_err"] < check.TOL
    assert torch.equal(cpu.launch_q[0], cpu.launch_q[2]) and not torch.equal(cpu.launch_q[2], cpu.launch_q[3])
    assert len(cpu.heartbeats) == 1 + 6  # `started`, then one progress event per launch, as without repeat


def test_a_batch_beats_before_its_first_launch(cpu):
    """The family servers' harness says `started` too: a hang in a request's first launch is
    then a stall, not a wait for the request's whole timeout."""
    cpu.checker.batch(2, seed=1)
    assert cpu.heartbeats == ["started", "call 1 of 2", "call 2 of 2"]


def test_the_server_warms_its_checker_up_with_one_call_before_its_first_request(cpu):
    assert check.warmed(cpu.checker) is cpu.checker and len(cpu.launch_q) == 1 and cpu.references == 1


def test_without_repeat_every_call_is_a_fresh_draw_with_its_own_reference(cpu):
    cpu.checker.batch(3, seed=3)
    assert cpu.references == 3
    fresh = cpu.launch_q[:]
    cpu.launch_q.clear()
    cpu.checker.batch(4, seed=3, repeat=2)
    # the draws come from the seed in the same order either way: repeat only launches each again
    assert torch.equal(cpu.launch_q[1], fresh[0]) and torch.equal(cpu.launch_q[2], fresh[1])


@pytest.mark.parametrize("bad", ["skip", "wrong"])
def test_every_repeated_launch_is_still_checked(cpu, bad):
    getattr(cpu, bad).update({2, 4})  # repeats of a draw, not its first launch
    res = cpu.checker.batch(6, seed=1, repeat=3)
    assert res["mismatched"] == 2
    if bad == "skip":  # the output poisoned before the launch stays NaN
        assert math.isinf(res["max_rel_err"])
    else:
        assert check.TOL < res["max_rel_err"] < math.inf


def test_a_flag_the_kernel_raises_makes_its_launch_mismatched(cpu):
    cpu.flag_at = 4
    res = cpu.checker.batch(6, seed=1, repeat=6)
    assert res["mismatched"] == 2 and res["metrics"]["kernel_flags"] == [kernel.ERROR_BITS[1]]


def test_repeat_below_one_is_refused(cpu):
    with pytest.raises(ValueError, match="repeat"):
        cpu.checker.batch(2, seed=1, repeat=0)


def test_device_relative_error_agrees_with_rel_err():
    ref = torch.randn(4, 8)
    out = ref + 0.01 * torch.randn(4, 8)
    assert float(reference.rel_err_tensor(out, ref)) == pytest.approx(reference.rel_err(out, ref), rel=1e-6)
    out[1, 2] = float("nan")
    assert math.isinf(reference.rel_err(out, ref)) and not float(reference.rel_err_tensor(out, ref)) <= check.TOL


def test_the_command_form_beats_with_hz_progress_lines_on_stderr(cpu, capsys):
    """`--calls N` (a command target) has no protocol to beat on: HZ_PROGRESS lines on stderr,
    as a family binary's `--once`, put its runs under the stall window too."""
    args = argparse.Namespace(lens_scale=65536, schedule="split", calls=2, seed=1, mishandle="none", repeat=1)
    assert check.once(args) == 0
    out, err = capsys.readouterr()
    assert out.startswith("HZ_RESULT ")
    assert err.splitlines() == ["HZ_PROGRESS started", "HZ_PROGRESS call 1 of 2", "HZ_PROGRESS call 2 of 2"]


def test_the_error_word_accessor_reads_the_counter_the_kernel_raises_flags_in():
    handle = SimpleNamespace(counters=torch.zeros(3, dtype=torch.int32))
    handle.counters[kernel.ERROR_WORD] |= 1
    assert int(kernel.error_word(handle)) == 1 and kernel.error_flags(handle) == [kernel.ERROR_BITS[1]]


def test_a_stderr_beat_is_a_progress_event_with_its_label_for_the_engine(capsys):
    from hazards.engine.progress import LineScanner, Progress

    check.stderr_beat("call 3 of 8")
    seen = Progress()
    LineScanner(seen).feed(capsys.readouterr().err.encode())
    assert seen.events == 1 and seen.last_label() == "call 3 of 8"
