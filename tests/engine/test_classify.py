"""Classification: one outcome per run, the documented precedence, and the signatures."""
import re
import signal

import pytest

from hazards.engine.classify import (NOTABLE_RE, NotableLines, classify_exit, classify_reply, find_fault_signature,
                             find_infra_signature, parse_result_line, python_exception,
                             reply_metrics, result_verdict, signal_name)
from hazards.engine.outcome import Outcome
from hazards.engine.targets import CommandTarget

CUDA_MESSAGES = [
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "illegal_address"),
    ("CUDA error: misaligned address", "misaligned_address"),
    ("cudaErrorLaunchFailure: unspecified launch failure", "launch_failure"),
    ("RuntimeError: CUDA error: device-side assert triggered", "device_assert"),
    ("error: an illegal instruction was encountered", "illegal_instruction"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
     "out_of_memory"),
    ("cudaMalloc failed: cudaErrorMemoryAllocation", "out_of_memory"),
    ("CUDA error 2 at kernel.cu:40: out of memory", "out_of_memory"),
    ("check failed: cudaErrorIllegalAddress", "illegal_address"),
    ("Memory access fault by GPU node-2 (Agent handle: 0x55) on address 0x7f. Reason: "
     "Page not present or supervisor privilege.", "rocm_memory_fault"),
    ("HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception.",
     "hsa_error"),
    ("launch returned cudaErrorLaunchOutOfResources", "cuda_error"),
]


@pytest.mark.parametrize("line,kind", CUDA_MESSAGES)
def test_fault_signatures_are_recognised_with_their_kind(line, kind):
    assert find_fault_signature(f"some log\n{line}\nmore log") == (kind, line)


@pytest.mark.parametrize("text", ["all good", "cudaError_t err = cudaSuccess;",
                                  "freed memory; host out of memory? no",
                                  "cudaErrorNoDevice: no CUDA-capable device is detected"])
def test_ordinary_text_and_infra_errors_are_not_fault_signatures(text):
    assert find_fault_signature(text) is None


@pytest.mark.parametrize("line", [m for m, _ in CUDA_MESSAGES] + [
    "CUDA error: no CUDA-capable device is detected", "CUDA driver version is insufficient",
    "no kernel image is available for execution on the device", 'HZ_RESULT {"ok": true}',
    '  FAITHFUL_RESULT {"cos": 1}', "Traceback (most recent call last):"])
def test_every_signature_line_is_kept_by_the_streaming_filter(line):
    data = f"noise 1\n{line}\nnoise 2\n".encode()
    assert [text for _, text in NOTABLE_RE.lines(data)] == [line]


def test_streaming_filter_keeps_first_and_last_of_a_flood_and_skips_lookalikes():
    flood = "".join(f'KERNEL_RESULT {{"i": {i}}}\ncudaError_t e{i};\n' for i in range(100))
    kept = [text for _, text in NOTABLE_RE.lines(flood.encode())]
    assert kept[:2] == ['KERNEL_RESULT {"i": 0}', 'KERNEL_RESULT {"i": 1}']
    assert kept[-1] == 'KERNEL_RESULT {"i": 99}' and len(kept) == 2 * NOTABLE_RE.keep
    assert not any("cudaError_t" in k for k in kept)


def test_a_pattern_without_a_keyword_is_refused():
    with pytest.raises(ValueError, match="without a keyword"):
        NotableLines(("segmentation violation",))


def test_infra_signatures_are_recognised():
    assert find_infra_signature("CUDA error: no CUDA-capable device is detected")[0] == "no_device"
    assert find_infra_signature("no kernel image is available for execution on the device"
                                )[0] == "no_kernel_image"


def test_result_line_tags_and_last_line_wins():
    text = ('noise\nHZ_RESULT {"ok": true}\nFAITHFUL_RESULT {"cos": 0.99}\n'
            'KERNEL_RESULT {"mismatched": 2}\ntrailing')
    assert parse_result_line(text) == ("KERNEL_RESULT", {"mismatched": 2})
    assert parse_result_line("HZ_RESULT not json\n") is None
    assert parse_result_line("HZ_RESULT [1, 2]\n") is None
    assert parse_result_line('prefix HZ_RESULT {"ok": false}') is None  # must start the line


def test_result_verdicts():
    assert result_verdict({"ok": False})[0] is Outcome.MISMATCH
    assert result_verdict({"ok": True, "mismatched": 3})[0] is Outcome.MISMATCH
    assert result_verdict({"mismatched": 0})[0] is Outcome.CLEAN
    assert result_verdict({"status": "fault", "message": "x"})[0] is Outcome.FAULT
    assert result_verdict({"status": "bad_reference"})[0] is Outcome.ERROR
    assert result_verdict({"cos": 0.999, "wall_us": 12}) is None  # metrics only


def test_a_signal_is_named_as_python_names_it_and_an_unnamed_one_by_its_number():
    assert signal_name(signal.SIGSEGV) == "SIGSEGV"
    assert [signal_name(n) for n in (9, 15, 34, 64)] == ["SIGKILL", "SIGTERM", "SIGRTMIN", "SIGRTMAX"]
    assert [signal_name(n) for n in (40, 99, 200)] == ["signal 40", "signal 99", "signal 200"]


@pytest.mark.parametrize("rc,out,err,expected,kind", [
    (0, "", "", Outcome.CLEAN, None),
    (1, "", "", Outcome.MISMATCH, "mismatch"),
    (2, "", "", Outcome.ERROR, "exit_2"),
    (3, "", "", Outcome.FAULT, "exit_3"),
    (7, "", "", Outcome.FAULT, "exit_7"),
    (-signal.SIGSEGV, "", "", Outcome.FAULT, "sigsegv"),
    (-signal.SIGABRT, "", "", Outcome.FAULT, "sigabrt"),
    (139, "", "", Outcome.FAULT, "sigsegv"),           # a shell's 128 + SIGSEGV
    (-signal.SIGKILL, "", "", Outcome.ERROR, "sigkill"),  # from outside, not a crash
    (1, "", "CUDA error: an illegal memory access was encountered", Outcome.FAULT,
     "illegal_address"),
    (0, "", "CUDA error: misaligned address", Outcome.FAULT, "misaligned_address"),
    (-signal.SIGABRT, "", "device-side assert triggered", Outcome.FAULT, "device_assert"),
    (1, "", "CUDA error: no CUDA-capable device is detected", Outcome.ERROR, "no_device"),
    (0, 'HZ_RESULT {"ok": false}', "", Outcome.MISMATCH, "mismatch"),
    (0, 'HZ_RESULT {"ok": true}', "", Outcome.CLEAN, None),
    (0, 'HZ_RESULT {"status": "bad_reference"}', "", Outcome.ERROR, "result_error"),
    (1, 'HZ_RESULT {"ok": true}', "", Outcome.MISMATCH, "mismatch"),  # never clean on exit 1
    (5, 'HZ_RESULT {"ok": true}', "", Outcome.FAULT, "exit_5"),
    (3, 'HZ_RESULT {"ok": false}', "", Outcome.FAULT, "exit_3"),
    (2, 'HZ_RESULT {"ok": false}', "", Outcome.ERROR, "exit_2"),
])
def test_exit_classification_follows_documented_precedence(rc, out, err, expected, kind):
    outcome, reason, evidence = classify_exit(rc, out, err)
    assert (outcome, evidence["error_kind"]) == (expected, kind), reason
    assert reason


def test_timeout_is_a_hang_even_with_a_fault_signature_in_the_output():
    outcome, reason, evidence = classify_exit(None, "", "CUDA error: misaligned address",
                                              timed_out=True, timeout=1.5)
    assert outcome is Outcome.HANG and evidence["error_kind"] == "timeout"
    assert reason == "timed out after 1.5s"
    assert evidence["fault_signature"]["kind"] == "misaligned_address"


def _traceback(last_line: str) -> str:
    return ("Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
            f"    main()\n{last_line}\n")


@pytest.mark.parametrize("last_line,expected,kind", [
    ("AssertionError: outputs differ", Outcome.MISMATCH, "mismatch"),
    ("ModuleNotFoundError: No module named 'triton'", Outcome.ERROR,
     "python_ModuleNotFoundError"),
    ("FileNotFoundError: [Errno 2] No such file or directory: 'w.bin'", Outcome.ERROR,
     "python_FileNotFoundError"),
    ("RuntimeError: something broke", Outcome.FAULT, "python_RuntimeError"),
    ("torch._dynamo.exc.BackendCompilerFailed: boom", Outcome.FAULT,
     "python_BackendCompilerFailed"),
])
def test_python_traceback_with_exit_1_is_judged_by_its_exception(last_line, expected, kind):
    outcome, reason, evidence = classify_exit(1, "", _traceback(last_line))
    assert (outcome, evidence["error_kind"]) == (expected, kind)
    assert last_line.split(":")[0] in reason


def test_python_exception_takes_the_last_traceback():
    err = _traceback("ValueError: first") + "During handling...\n" + _traceback("KeyError: 2")
    assert python_exception(err) == ("KeyError", "KeyError: 2")
    assert python_exception("no traceback here") is None


def test_result_regex_match_is_a_mismatch_with_named_groups_as_evidence():
    rx = re.compile(r"max_err=(?P<max_err>\S+) FAIL", re.MULTILINE)
    outcome, _, evidence = classify_exit(0, "step 1\nmax_err=0.5 FAIL\n", "", result_regex=rx)
    assert outcome is Outcome.MISMATCH
    assert evidence["regex_match"]["groups"] == {"max_err": "0.5"}
    assert classify_exit(0, "max_err=0.0 PASS\n", "", result_regex=rx)[0] is Outcome.CLEAN


@pytest.mark.parametrize("reply,expected,kind", [
    ({"id": 1, "status": "ok", "mismatched": 0}, Outcome.CLEAN, None),
    ({"id": 1, "status": "ok", "mismatched": 4, "launches": 10}, Outcome.MISMATCH, "mismatch"),
    ({"id": 1, "status": "fault", "message": "an illegal memory access was encountered"},
     Outcome.FAULT, "illegal_address"),
    ({"id": 1, "status": "fault"}, Outcome.FAULT, "device_error"),
    ({"id": 1, "status": "bad_reference", "message": "ref NaN"}, Outcome.ERROR, "bad_reference"),
    ({"id": 1, "status": "bad_request"}, Outcome.ERROR, "bad_request"),
    ({"id": 1, "status": "ok"}, Outcome.ERROR, "protocol"),  # unjudgeable, never clean
    ({"id": 1, "status": "weird"}, Outcome.ERROR, "protocol"),
])
def test_reply_classification(reply, expected, kind):
    outcome, reason, evidence = classify_reply(reply)
    assert (outcome, evidence["error_kind"]) == (expected, kind), reason


def test_reply_metrics_merge_counts_and_metrics():
    reply = {"id": 3, "status": "ok", "launches": 10, "mismatched": 1, "kernel_ms": 0.5,
             "metrics": {"weak": 2}}
    assert reply_metrics(reply) == {"launches": 10, "mismatched": 1, "kernel_ms": 0.5,
                                    "weak": 2}


@pytest.mark.parametrize("signum, expected", [
    (signal.SIGKILL, Outcome.ERROR), (signal.SIGTERM, Outcome.ERROR), (signal.SIGINT, Outcome.ERROR),
    (signal.SIGHUP, Outcome.ERROR), (signal.SIGQUIT, Outcome.ERROR),
    (signal.SIGSEGV, Outcome.FAULT), (signal.SIGBUS, Outcome.FAULT), (signal.SIGUSR1, Outcome.FAULT),
])
def test_a_shells_128_plus_n_reads_as_death_by_signal_n(signum, expected):
    """A wrapper script reports its child's death by signal N as exit 128+N: the same verdict
    as the signal itself (exit 137 is a SIGKILL from outside the watchdog: error, not fault)."""
    direct = classify_exit(-signum)
    shell = classify_exit(128 + signum)
    assert direct[0] is shell[0] is expected, shell[1]
    assert shell[2]["error_kind"] == direct[2]["error_kind"] and shell[2]["shell_reported"]
    assert shell[2]["signal"] == signal_name(signum)


def test_a_wrapper_script_whose_child_is_sigkilled_is_an_error_run(fake_env):
    script = "sh -c 'kill -KILL $$'; exit $?"
    result = CommandTarget(["sh", "-c", script], env=fake_env).run(timeout=20)
    assert result.outcome is Outcome.ERROR and result.error_kind == "sigkill", result.reason


@pytest.mark.parametrize("code, stderr", [
    (127, "sh: 1: ./nosuch: not found\n"),
    (127, "bash: nosuch: command not found\n"),
    (126, "bash: ./kernel.txt: Permission denied\n"),
])
def test_a_shell_that_could_not_start_the_program_is_an_error_not_a_fault(code, stderr):
    """`sh -c ./nosuch` exits 127: nothing of the target ran (a mutant whose binary is missing
    must not count as killed, a wrapper with a typo must not raise the fault rate)."""
    outcome, reason, evidence = classify_exit(code, "", stderr)
    assert outcome is Outcome.ERROR and "could not be started" in reason, reason
    assert evidence["error_kind"] == f"exit_{code}"


def test_a_program_that_exits_127_on_its_own_is_still_a_fault():
    outcome, _, _ = classify_exit(127, "", "kernel: checksum differs\n")
    assert outcome is Outcome.FAULT
