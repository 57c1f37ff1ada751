"""Judge a run: exactly one outcome, a reason in words, and the evidence it rests on.

Two entry points: `classify_exit` for a finished (or timed-out) process and
`classify_reply` for a server-target reply. Both return `(Outcome, reason, evidence)`;
`evidence["error_kind"]` is a short machine key ("illegal_address", "sigsegv", "timeout",
"protocol", ...) that the targets copy into `RunResult.error_kind` and the store uses to
group repeated failures. The precedence for processes is documented in docs/protocol.md
("Exit-code convention") and implemented, in that order, in `classify_exit`.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import json
import math
import re
import signal
from collections.abc import Iterator
from typing import Any

from .outcome import Outcome
from .protocol import field_problem, shown

# CUDA statuses that say the machine or the build is unusable, not that a kernel failed.
_INFRA_ENUMS = ("NoDevice", "InsufficientDriver", "DevicesUnavailable", "NoKernelImageForDevice",
                "InvalidDeviceFunction", "NotReady", "SystemDriverMismatch",
                "CompatNotSupportedOnDevice", "UnsupportedPtxVersion")
_INFRA_PATTERNS: tuple[tuple[str, str], ...] = (
    ("no_device", r"no CUDA-capable device is detected|cudaErrorNoDevice|CUDA_ERROR_NO_DEVICE"
                  r"|hipErrorNoDevice|all CUDA-capable devices are busy or unavailable"
                  r"|cudaErrorDevicesUnavailable"),
    ("driver", r"CUDA driver version is insufficient|cudaErrorInsufficientDriver"
               r"|cudaErrorSystemDriverMismatch|cudaErrorCompatNotSupportedOnDevice"),
    ("no_kernel_image", r"no kernel image is available for execution on the device"
                        r"|cudaErrorNoKernelImageForDevice|cudaErrorInvalidDeviceFunction"
                        r"|cudaErrorUnsupportedPtxVersion|hipErrorNoBinaryForGpu"),
)
_INFRA_RES = tuple((kind, re.compile(pat)) for kind, pat in _INFRA_PATTERNS)

# (error_kind, pattern). Order matters: the first kind whose pattern matches a line wins,
# so specific messages come before the generic CUDA enum fallback.
_FAULT_PATTERNS: tuple[tuple[str, str], ...] = (
    ("illegal_address", r"an illegal memory access was encountered|cudaErrorIllegalAddress"
                        r"|CUDA_ERROR_ILLEGAL_ADDRESS|hipErrorIllegalAddress"),
    ("misaligned_address", r"misaligned address|cudaErrorMisalignedAddress"
                           r"|CUDA_ERROR_MISALIGNED_ADDRESS"),
    ("launch_failure", r"unspecified launch failure|cudaErrorLaunchFailure"
                       r"|CUDA_ERROR_LAUNCH_FAILED|hipErrorLaunchFailure"),
    ("device_assert", r"device-side assert(?:ion)? triggered|cudaErrorAssert|CUDA_ERROR_ASSERT"),
    ("illegal_instruction", r"an illegal instruction was encountered|cudaErrorIllegalInstruction"
                            r"|CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    ("launch_timeout", r"the launch timed out and was terminated|cudaErrorLaunchTimeout"),
    ("out_of_memory", r"CUDA out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY"
                      r"|hipErrorOutOfMemory|(?:CUDA|HIP|cuda|hip|GPU|device)[^\n]*"
                      r"\bout of memory\b"),
    ("rocm_memory_fault", r"Memory access fault by GPU node"),
    ("hsa_error", r"HSA_STATUS_ERROR\w*"),
    ("ecc_error", r"uncorrectable ECC error|cudaErrorECCUncorrectable"),
    ("cuda_error", r"\bcudaError(?!_t\b|" + "|".join(_INFRA_ENUMS) + r")[A-Z]\w+"
                   r"|\bCUDA_ERROR_(?!NO_DEVICE|INVALID_DEVICE|NOT_READY)[A-Z_]+"),
)
_FAULT_RES = tuple((kind, re.compile(pat)) for kind, pat in _FAULT_PATTERNS)

# A line that starts with a result tag is a result line, whatever follows the tag: what
# follows must then be one JSON object with well-typed fields, or the run cannot be judged.
_RESULT_RE = re.compile(r"^[ \t]*(HZ_RESULT|FAITHFUL_RESULT|KERNEL_RESULT)(?![A-Za-z0-9_])[ \t:=]*(.*?)[ \t]*$",
                        re.MULTILINE)

# The faithful per-task line (docs/protocol.md, "FAITHFUL_RESULT"): every such line counts,
# and one without these keys (well typed) is malformed like any unreadable result line.
FAITHFUL_TAG = "FAITHFUL_RESULT"
DEFAULT_FAITHFUL_COS_MIN = 0.99
_NUMBER = (int, float)
FAITHFUL_KEYS: dict[str, tuple[type, ...]] = {
    "task_id": (int,), "task": (str,), "slowCTA_us": _NUMBER, "wall_us": _NUMBER, "sumCTA_us": _NUMBER,
    "cos": _NUMBER, "workers": (int,), "shape": (dict, list, str), "build": (str,)}

class NotableLines:
    """Finds the lines worth keeping from a stream too long to keep whole (fault and
    infrastructure signatures, result lines, tracebacks), at memory-search speed.

    One regex with all the alternatives above scans ~1 MB/s in Python, which would
    throttle a chatty program. So each chunk is searched for literal keywords (C memmem,
    ~100 MB/s for all of them); a line with a keyword is kept (filed under that keyword)
    if it passes that keyword's cheap check, if any. Keeping a few lines too many is
    harmless: classification runs the real patterns over what was kept. Every pattern
    must contain a keyword, or its lines could be lost (checked at construction).

    What is kept of a line is a window around the keyword, bounded on both sides, so a
    progress bar that never ends its line (tqdm redraws with carriage returns) cannot hide
    a fault message at column 10,000 nor make the supervisor buffer the whole line: a
    carriage return ends a line too, the window reaches `BEFORE` bytes back and `AFTER`
    bytes on (`RESULT_AFTER` for a result line, which must be kept whole to be parsed).
    """

    # keyword -> a cheap check for keywords that also occur in ordinary output
    KEYWORDS: dict[str, str | None] = {
        "llegal": None, "ILLEGAL": None, "isaligned": None, "MISALIGNED": None,
        "launch failure": None, "launch timed out": None, "cudaError": r"cudaError[A-Z]",
        "CUDA_ERROR_": None, "hipError": r"hipError[A-Z]", "device-side assert": None,
        "out of memory": None, "Memory access fault": None, "HSA_STATUS_ERROR": None,
        "ECC error": None, "CUDA-capable": None, "driver version": None,
        "kernel image": None, "_RESULT": r"(?:HZ|FAITHFUL|KERNEL)_RESULT",
        "Traceback": r"Traceback \(most recent call last\)"}
    RESULT_KEYWORD = "_RESULT"
    BEFORE = 300            # bytes of a long line kept before its keyword
    AFTER = 700             # ... and from the keyword on
    RESULT_AFTER = 1 << 16  # a result line is kept whole up to this many bytes
    TRUNCATED = " [line truncated]"

    PATTERN_KEYWORD = "result_regex"  # what lines found by `with_pattern`'s regex are filed under

    def __init__(self, patterns: tuple[str, ...], keep: int = 10) -> None:
        for pattern in patterns:
            if not any(k in pattern for k in self.KEYWORDS):
                raise ValueError(f"notable pattern without a keyword: {pattern!r}")
        self.keep = keep
        self.checks = {k.encode(): re.compile(v.encode()) if v else None
                       for k, v in self.KEYWORDS.items()}
        self.max_after = max(self.AFTER, self.RESULT_AFTER)
        self._longest = max(len(k) for k in self.checks)
        self._pattern: re.Pattern[bytes] | None = None

    def with_pattern(self, regex: str | re.Pattern[str]) -> "NotableLines":
        """These lines, plus those where a target's own `result_regex` matches (it has no
        keyword: it is searched as a regex, kept whole like a result line). A match must lie
        within one line of at most `RESULT_AFTER` bytes after its start to be found."""
        other = copy.copy(self)
        source = regex.pattern if isinstance(regex, re.Pattern) else regex
        flags = (regex.flags if isinstance(regex, re.Pattern) else 0) & ~re.UNICODE
        try:  # the output is bytes: a str pattern as UTF-8 bytes (\w, \d then mean ASCII)
            other._pattern = re.compile(source.encode("utf-8"), flags | re.MULTILINE)
        except re.error:  # a str-only construct: searched over Latin-1, byte for character
            other._pattern = _Latin1Pattern(re.compile(source, flags | re.MULTILINE))
        return other

    def _positions(self, data: bytes | bytearray, keyword: bytes, check: re.Pattern[bytes] | None,
                   lo: int, hi: int) -> list[int]:
        """Where `keyword` (passing `check`) starts within [lo, hi): all of them, or in a
        flood only the first and last `keep` (the drain keeps no more), so a flood costs
        no more."""
        end = min(len(data), hi + self._longest)
        if data.find(keyword, lo, end) < 0:  # memmem first: the common case costs nothing more
            return []
        if check is not None:
            at = [m.start() for m in check.finditer(data, max(0, lo - self._longest), end)
                  if lo <= m.start() < hi]
            return at if len(at) <= 2 * self.keep else at[:self.keep] + at[-self.keep:]
        head, tail, pos = [], [], lo - 1
        while len(head) < self.keep:
            pos = data.find(keyword, pos + 1, end)
            if pos < 0 or pos >= hi:
                return head
            head.append(pos)
        pos = end
        while len(tail) < self.keep:
            pos = data.rfind(keyword, head[-1] + 1, pos + len(keyword) - 1)
            if pos < 0:
                break
            if pos < hi:
                tail.append(pos)
        return head + tail[::-1]

    def window(self, data: bytes | bytearray, at: int, keyword: bytes, final: bool = True) -> tuple[int, str]:
        """(start, text) of the kept part of the line around position `at` of `data`.

        The line ends at a newline or carriage return; a long one is cut `BEFORE` bytes
        before `at` (marked with a leading '…') and `AFTER` / `RESULT_AFTER` bytes after it
        (marked `TRUNCATED`, which no parser mistakes for the rest of a JSON object).
        """
        whole = keyword in (self.RESULT_KEYWORD.encode(), self.PATTERN_KEYWORD.encode())
        after = self.RESULT_AFTER if whole else self.AFTER
        floor = max(0, at - self.BEFORE)
        start = max(data.rfind(b"\n", floor, at), data.rfind(b"\r", floor, at)) + 1
        clipped_front = start == 0 and floor > 0
        if start == 0:
            start = floor
        ceiling = min(len(data), at + after)
        ends = [e for e in (data.find(b"\n", at, ceiling), data.find(b"\r", at, ceiling)) if e >= 0]
        end = min(ends) if ends else ceiling
        text = bytes(data[start:end]).decode("utf-8", "replace")
        if clipped_front:
            text = "…" + text
        if not ends and (ceiling < len(data) or not final):
            text += self.TRUNCATED
        return start, text

    def hits(self, data: bytes | bytearray, lo: int = 0, hi: int | None = None) -> list[tuple[bytes, int]]:
        """(keyword, position) of every kept keyword that starts within [lo, hi)."""
        hi = len(data) if hi is None else hi
        found: list[tuple[bytes, int]] = []
        for keyword, check in self.checks.items():
            found += [(keyword, at) for at in self._positions(data, keyword, check, lo, hi)]
        if self._pattern is not None:  # the first and last `keep` matches, like keywords
            head: list[int] = []
            tail: collections.deque[int] = collections.deque(maxlen=self.keep)
            for m in self._pattern.finditer(data, lo):
                if m.start() >= hi:
                    break
                (head if len(head) < self.keep else tail).append(m.start())
            found += [(self.PATTERN_KEYWORD.encode(), a) for a in head + list(tail)]
        return found

    def lines(self, data: bytes) -> list[tuple[str, str]]:
        """(keyword, kept line) for each kept line of `data` (all of it), in order."""
        found: dict[int, tuple[str, str]] = {}
        for keyword, at in self.hits(data):
            start, text = self.window(data, at, keyword)
            if start not in found:
                found[start] = (keyword.decode(), text)
        return [found[start] for start in sorted(found)]


class _Latin1Pattern:
    """A str regex searched over bytes read as Latin-1 (one character per byte, so match
    positions are byte offsets)."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern

    def finditer(self, data: bytes | bytearray, pos: int = 0) -> Iterator[re.Match[str]]:
        return self.pattern.finditer(bytes(data).decode("latin-1"), pos)


# What the watchdog's drains keep (pass as `Supervised(..., notable_re=NOTABLE_RE)`).
NOTABLE_RE = NotableLines(tuple(pat for _, pat in _FAULT_PATTERNS + _INFRA_PATTERNS)
                          + ("HZ_RESULT|FAITHFUL_RESULT|KERNEL_RESULT", "Traceback"))

# Signals that mean the program crashed by itself (fault), as opposed to being told to
# stop from outside (an operator, a batch system, the OOM killer: error, not a hazard).
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                           signal.SIGABRT, signal.SIGTRAP, signal.SIGSYS})
EXTERNAL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                              signal.SIGQUIT})
# A shell reports its child's death by signal N as exit 128+N (N up to the last real-time signal).
_MAX_SIGNAL = 64
# Uncaught Python exceptions that mean the program could not even start its work.
_SETUP_EXCEPTIONS = frozenset({"ModuleNotFoundError", "ImportError", "SyntaxError",
                               "IndentationError", "TabError", "FileNotFoundError",
                               "PermissionError", "IsADirectoryError", "NotADirectoryError"})
_TRACEBACK = "Traceback (most recent call last):"
_EXC_LINE_RE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_SHOWN = 300  # characters of a matched line kept in reasons/evidence


def signal_name(signum: int) -> str:
    """`SIGSEGV` for 11; `signal 77` for numbers without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _line_at(text: str, pos: int) -> str:
    """The line around position `pos`; a long one shown around `pos`, so what matched
    there is always in what is shown."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start:end if end >= 0 else len(text)]
    if len(line) > _SHOWN:
        lo = max(0, min(pos - start - _SHOWN // 3, len(line) - _SHOWN))
        line = ("…" if lo else "") + line[lo:lo + _SHOWN]
    return line.strip()


def _first_match(res: tuple[tuple[str, re.Pattern[str]], ...], text: str) -> tuple[str, str] | None:
    for kind, rx in res:
        m = rx.search(text)
        if m:
            return kind, _line_at(text, m.start())
    return None


def find_infra_signature(text: str) -> tuple[str, str] | None:
    """A message saying the GPU or build is unusable (no device, old driver, no kernel
    image for this architecture) as (error_kind, line): an `error`, not a hazard."""
    return _first_match(_INFRA_RES, text)


def find_fault_signature(text: str) -> tuple[str, str] | None:
    """The first device-fault signature in `text` as (error_kind, the line it is on).

    Kinds are checked in a fixed order (specific messages before the generic CUDA enum
    names), so "CUDA error: an illegal memory access was encountered" is `illegal_address`.
    """
    return _first_match(_FAULT_RES, text)


# Words by which an unreadable result line still says the run failed (whole words, any case).
_FAILURE_WORD_RE = re.compile(r"\b(?:mismatch|fail|failed|wrong|incorrect)\b", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class MalformedLine:
    """A result line that cannot be judged: its tag, its JSON (None if it is not JSON),
    the text after the tag, and `problem`, which quotes the line and says why."""

    tag: str
    payload: Any
    body: str
    problem: str

    def failure_signal(self, cos_min: float) -> str | None:
        """What in this line still says the run failed, or None: a FAITHFUL_RESULT `cos`
        below `cos_min` ("cos 0.5 < 0.99"), or a failure word ("the word 'mismatch'") in
        its string values (in its text, when it is not JSON). Key names do not count."""
        cos = self.payload.get("cos") if isinstance(self.payload, dict) else None
        if self.tag == FAITHFUL_TAG and isinstance(cos, _NUMBER) and not isinstance(cos, bool) \
                and -1.0 <= cos < cos_min:
            return f"cos {cos:.6g} < {cos_min:g}"
        for text in _strings(self.payload) if self.payload is not None else [self.body]:
            word = _FAILURE_WORD_RE.search(text)
            if word:
                return f"the word {word.group(0)!r}"
        return None


def _strings(value: Any) -> Iterator[str]:
    """Every string value inside a JSON value (not the keys of its objects)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


@dataclasses.dataclass(frozen=True)
class ResultLine:
    """One well-formed result line: its tag, its JSON object, and the line as printed."""

    tag: str
    payload: dict[str, Any]
    line: str


def result_problem(payload: Any) -> str | None:
    """Why a result line's JSON cannot be judged (not an object, or fields of the wrong
    type: the server reply's rules, `protocol.field_problem`), or None."""
    if not isinstance(payload, dict):
        return f"not a JSON object but {type(payload).__name__}"
    return field_problem(payload)


def faithful_problem(payload: Any) -> str | None:
    """Why a FAITHFUL_RESULT payload is malformed, or None if it is well-formed.

    Required: task_id (int), task (str), slowCTA_us / wall_us / sumCTA_us (finite numbers
    >= 0), cos (a finite number in [-1, 1]), workers (int >= 1), shape (object, list or
    string), build (string). Booleans are not numbers here.
    """
    if not isinstance(payload, dict):
        return "not a JSON object"
    for key, types in FAITHFUL_KEYS.items():
        if key not in payload:
            return f"missing key {key!r}"
        value = payload[key]
        if isinstance(value, bool) or not isinstance(value, types):
            return f"{key!r} has the wrong type ({type(value).__name__})"
        if types is _NUMBER and not math.isfinite(value):
            return f"{key!r} is not finite"
    for key in ("slowCTA_us", "wall_us", "sumCTA_us"):
        if payload[key] < 0:
            return f"{key!r} is negative"
    if not -1.0 - 1e-9 <= payload["cos"] <= 1.0 + 1e-9:
        return "'cos' is outside [-1, 1]"
    if payload["workers"] < 1:
        return "'workers' is below 1"
    return None


def parse_result_lines(text: str) -> tuple[list[ResultLine], list[MalformedLine]]:
    """Every result line of `text`: (the well-formed ones in order, the others). A
    malformed line's `problem` quotes it: 'malformed HZ_RESULT line (not JSON):
    \'HZ_RESULT {"ok": false, max_err: 3}\''. A line printed twice counts once."""
    good: dict[str, ResultLine] = {}
    problems: dict[str, MalformedLine] = {}
    for m in _RESULT_RE.finditer(text):
        line, tag, body = m.group(0).strip(), m.group(1), m.group(2)
        payload: Any = None
        try:
            payload = json.loads(body)
        except ValueError:
            why: str | None = "not JSON" if body else "nothing after the tag"
        else:
            why = result_problem(payload)
            if why is None and tag == FAITHFUL_TAG:
                why = faithful_problem(payload)
        if why:
            problems.setdefault(line, MalformedLine(tag, payload, body,
                                                    f"malformed {tag} line ({why}): {shown(line)!r}"))
        else:
            good.pop(line, None)  # the last print of a line decides its place
            good[line] = ResultLine(tag, payload, shown(line))
    return list(good.values()), list(problems.values())


def parse_result_line(text: str) -> tuple[str, dict[str, Any]] | None:
    """The last well-formed result line of `text` as (tag, payload), None if there is none."""
    good, _ = parse_result_lines(text)
    return (good[-1].tag, good[-1].payload) if good else None


def result_verdict(payload: dict[str, Any]) -> tuple[Outcome, str] | None:
    """The verdict a result line carries, or None if it only carries metrics.

    `"status"` (as in a server reply), `"ok": false`, or `"mismatched": N > 0` mean a
    failure; `"ok": true` or `"mismatched": 0` mean clean. Any failure indicator wins.
    """
    status = payload.get("status")
    if status == "fault":
        return Outcome.FAULT, f"result line: fault: {payload.get('message', '')}".rstrip(": ")
    if status in ("bad_reference", "bad_request", "unsupported"):
        return Outcome.ERROR, f"result line: {status}"
    mismatched = payload.get("mismatched")
    if payload.get("ok") is False:
        return Outcome.MISMATCH, "result line: ok=false"
    if isinstance(mismatched, (int, float)) and not isinstance(mismatched, bool) and mismatched > 0:
        return Outcome.MISMATCH, f"result line: {mismatched} mismatched"
    if payload.get("ok") is True or mismatched == 0 or status == "ok":
        return Outcome.CLEAN, "result line: ok"
    return None


def python_exception(stderr: str) -> tuple[str, str] | None:
    """The uncaught exception of the last Python traceback in `stderr` as (type, line)."""
    at = stderr.rfind(_TRACEBACK)
    if at < 0:
        return None
    for line in stderr[at + len(_TRACEBACK):].splitlines():
        if not line or line[0] in " \t":  # frames and source lines are indented
            continue
        m = _EXC_LINE_RE.match(line.strip())
        if m:
            return m.group(1).rsplit(".", 1)[-1], line.strip()[:_SHOWN]
    return None


def _verdict(outcome: Outcome, reason: str, evidence: dict[str, Any],
             error_kind: str | None) -> tuple[Outcome, str, dict[str, Any]]:
    evidence["error_kind"] = error_kind
    return outcome, reason, evidence


def _classify_exit_1(stderr: str, evidence: dict[str, Any]) -> tuple[Outcome, str, dict[str, Any]]:
    """Exit code 1 without a result-line verdict: mismatch, unless a traceback says otherwise."""
    exc = python_exception(stderr)
    if exc is None:
        return _verdict(Outcome.MISMATCH, "exit code 1 (hazard observed)", evidence, "mismatch")
    name, line = exc
    evidence["python_exception"] = line
    if name == "AssertionError":  # the program's own check failed: a wrong answer
        return _verdict(Outcome.MISMATCH, f"exit code 1: {line}", evidence, "mismatch")
    if name in _SETUP_EXCEPTIONS:  # it never got to run its work: infrastructure
        return _verdict(Outcome.ERROR, f"exit code 1: {line}", evidence, f"python_{name}")
    return _verdict(Outcome.FAULT, f"exit code 1: uncaught {line}", evidence, f"python_{name}")


# What a shell prints when it cannot start a program (its exit 127 / 126).
_SHELL_COULD_NOT_START = re.compile(r"^.*(?:command not found|: not found|No such file or directory|"
                                    r"Permission denied|cannot execute).*$", re.M)


def classify_exit(returncode: int | None, stdout: str = "", stderr: str = "", *,
                  timed_out: bool = False, timeout: float | None = None,
                  result_regex: re.Pattern[str] | None = None,
                  faithful_cos_min: float = DEFAULT_FAITHFUL_COS_MIN,
                  ) -> tuple[Outcome, str, dict[str, Any]]:
    """Judge a process from its exit status and output. Returns (outcome, reason, evidence).

    Precedence (first rule that applies): timed out -> hang; crash signal or fault
    signature -> fault; infra signature (no device, driver, no kernel
    image) -> error; signal from outside -> error; exit 3 -> fault; exit 2 -> error; a shell's
    126/127 with its could-not-start message -> error;
    other exit >= 4 -> fault (a shell's 128+N read as signal N); a result line's
    fault/error status; a FAITHFUL_RESULT cos below `faithful_cos_min`, a failing result
    line or a `result_regex` match -> mismatch; a malformed result line (not a JSON
    object, fields of the wrong type, a FAITHFUL_RESULT without its keys) -> mismatch if
    something else says the run failed (exit 1, a failure word or a low cos in that line;
    the reason notes the line), else error; exit 1 -> mismatch (or the uncaught Python
    exception's class: AssertionError mismatch, import / file errors error, anything else
    fault); exit 0 -> clean, unless the result line or regex said otherwise. A result line
    never turns a non-zero exit into clean.
    `returncode` is Popen's: negative for death by signal; None if still running.
    """
    text = f"{stdout}\n{stderr}"
    evidence: dict[str, Any] = {"exit_code": returncode}
    signature = find_fault_signature(text)
    if signature:
        evidence["fault_signature"] = {"kind": signature[0], "line": signature[1]}
    results, malformed = parse_result_lines(stdout)
    more = parse_result_lines(stderr)
    faithful = [r.payload for r in results + more[0] if r.tag == FAITHFUL_TAG]  # every one counts
    results, malformed = results or more[0], malformed + more[1]
    if faithful:
        evidence["faithful"] = faithful
    result = (results[-1].tag, results[-1].payload) if results else None
    if results:
        evidence["result"] = {"tag": results[-1].tag, "payload": results[-1].payload,
                              "line": results[-1].line}
    if malformed:
        evidence["result_problems"] = [m.problem for m in malformed[:10]]
    signum = None
    if returncode is not None and returncode < 0:
        signum = -returncode
    elif returncode is not None and 128 < returncode <= 128 + _MAX_SIGNAL:
        signum = returncode - 128  # a shell reporting its child's death by signal N
        evidence["shell_reported"] = True
    if signum is not None:
        evidence["signal"] = signal_name(signum)

    if timed_out:
        limit = f" after {timeout:g}s" if timeout is not None else ""
        return _verdict(Outcome.HANG, f"timed out{limit}", evidence, "timeout")
    if signum is not None and signum not in EXTERNAL_SIGNALS:
        sig = signal_name(signum)
        if signature:
            return _verdict(Outcome.FAULT, f"{signature[1]} ({sig})", evidence, signature[0])
        return _verdict(Outcome.FAULT, f"killed by {sig}", evidence, sig.lower().replace(" ", "_"))
    if signature:
        return _verdict(Outcome.FAULT, signature[1], evidence, signature[0])
    infra = find_infra_signature(text)
    if infra:
        evidence["infra_signature"] = {"kind": infra[0], "line": infra[1]}
        return _verdict(Outcome.ERROR, f"unusable GPU or build: {infra[1]}", evidence, infra[0])
    if signum is not None:
        sig = signal_name(signum)
        return _verdict(Outcome.ERROR, f"killed by {sig} from outside the watchdog "
                        "(operator, batch system or OOM killer)", evidence, sig.lower())
    if returncode is None:
        return _verdict(Outcome.ERROR, "process has not exited", evidence, "no_exit")
    if returncode == 3:
        return _verdict(Outcome.FAULT, "exit code 3 (device error)", evidence, "exit_3")
    if returncode == 2:
        return _verdict(Outcome.ERROR, "exit code 2 (bad reference or bad input)",
                        evidence, "exit_2")
    if returncode in (126, 127) and _SHELL_COULD_NOT_START.search(stderr):
        # A shell could not start the program (command not found / not executable): nothing
        # of the target ran, so nothing was judged.
        what = "not found" if returncode == 127 else "not executable"
        return _verdict(Outcome.ERROR, f"exit code {returncode}: the program could not be started ({what}): "
                        f"{_SHELL_COULD_NOT_START.search(stderr).group(0).strip()[:160]}", evidence,
                        "exit_127" if returncode == 127 else "exit_126")
    if returncode not in (0, 1):
        return _verdict(Outcome.FAULT, f"exit code {returncode}", evidence, f"exit_{returncode}")

    verdict = result_verdict(result[1]) if result else None
    if verdict and verdict[0] in (Outcome.FAULT, Outcome.ERROR):
        kind = "result_fault" if verdict[0] is Outcome.FAULT else "result_error"
        return _verdict(verdict[0], verdict[1], evidence, kind)
    # A malformed line cannot be judged, but it does not cancel what else says the run
    # failed: every failure signal below is a mismatch whose reason notes the line.
    note = f" ({malformed[0].problem})" if malformed else ""
    low = [p for p in faithful if p["cos"] < faithful_cos_min]
    if low:
        worst = min(low, key=lambda p: p["cos"])
        return _verdict(Outcome.MISMATCH, f"FAITHFUL_RESULT cos {worst['cos']:.6g} < {faithful_cos_min:g} "
                        f"(task {worst['task_id']} {worst['task']!s:.40}, workers {worst['workers']})"
                        + note, evidence, "mismatch")
    if verdict and verdict[0] is Outcome.MISMATCH:
        return _verdict(Outcome.MISMATCH, verdict[1] + note, evidence, "mismatch")
    if result_regex is not None:
        m = result_regex.search(text)
        if m:
            evidence["regex_match"] = {"line": _line_at(text, m.start()),
                                       "groups": m.groupdict()}
            return _verdict(Outcome.MISMATCH, f"output matched {result_regex.pattern!r}{note}",
                            evidence, "mismatch")
    if returncode == 1:
        outcome, reason, evidence = _classify_exit_1(stderr, evidence)
        return outcome, reason + note, evidence
    for line in malformed:
        said = line.failure_signal(faithful_cos_min)
        if said:
            return _verdict(Outcome.MISMATCH, f"result line says the run failed ({said}): {line.problem}",
                            evidence, "mismatch")
    if malformed:  # a result line nobody can read, and nothing says the run failed
        return _verdict(Outcome.ERROR, malformed[0].problem, evidence, "result_malformed")
    return _verdict(Outcome.CLEAN, verdict[1] if verdict else "exit code 0", evidence, None)


def reply_metrics(reply: dict[str, Any]) -> dict[str, Any]:
    """The numbers a server reply reports: its counts and timings, plus its `metrics`."""
    metrics = {k: reply[k] for k in ("launches", "mismatched", "bad_elements", "max_rel_err",
                                     "kernel_ms", "seed") if k in reply}
    metrics.update(reply.get("metrics") or {})
    return metrics


def classify_reply(reply: dict[str, Any]) -> tuple[Outcome, str, dict[str, Any]]:
    """Judge one validated server reply (docs/protocol.md, "Reply").

    ok -> clean or mismatch (by `mismatched`); fault -> fault (error_kind from the fault
    signature in `message` if any, else "device_error"); bad_reference / bad_request /
    unsupported (a build that cannot run the point: error kind "unsupported") ->
    error. An unknown status is a protocol error (error), never clean.
    """
    status = reply.get("status")
    evidence: dict[str, Any] = {"status": status}
    message = str(reply.get("message", ""))[:_SHOWN]
    if message:
        evidence["message"] = message
    if status == "ok":
        mismatched = reply.get("mismatched")
        if type(mismatched) is not int or mismatched < 0:
            return _verdict(Outcome.ERROR, f"protocol error: ok reply with mismatched="
                            f"{mismatched!r}", evidence, "protocol")
        if mismatched > 0:
            launches = reply.get("launches")
            of = f" of {launches}" if launches is not None else ""
            return _verdict(Outcome.MISMATCH, f"{mismatched}{of} launches mismatched",
                            evidence, "mismatch")
        return _verdict(Outcome.CLEAN, "ok", evidence, None)
    if status == "fault":
        signature = find_fault_signature(message)
        kind = signature[0] if signature else "device_error"
        return _verdict(Outcome.FAULT, f"device fault: {message or 'no message'}", evidence, kind)
    if status in ("bad_reference", "bad_request", "unsupported"):
        return _verdict(Outcome.ERROR, f"{status}: {message or 'no message'}", evidence, status)
    return _verdict(Outcome.ERROR, f"protocol error: unknown status {str(status)[:50]!r}",
                    evidence, "protocol")
