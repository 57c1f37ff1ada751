"""What every target shares: input validation, the `Target` interface, `WrapperTarget`.

Bad input is a one-line UserError; `WrapperTarget` is the base of targets that add something
around another target's runs."""
from __future__ import annotations

import abc
import inspect
import math
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from ..errors import UserError, check_seconds
from ..outcome import Outcome, RunResult

_NAME_CHARS = 200


def check_argv(argv: Any, cwd: str | os.PathLike[str] | None, env: dict[str, str]) -> list[str]:
    """A validated argv: a non-empty list of strings whose program exists and is executable.

    Raises UserError (one line) before any process is started. A program with a slash is
    resolved against `cwd`; one without is looked up on the PATH the child will get.
    """
    if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)):
        raise UserError("command must be a list of arguments, not a string (no shell is used)")
    if not argv:
        raise UserError("empty command: nothing to run")
    if not all(isinstance(a, str) for a in argv):
        raise UserError(f"command arguments must be strings: {argv!r}")
    program = argv[0]
    if not program.strip():
        raise UserError("empty command: the program name is blank")
    if "\0" in "".join(argv):
        raise UserError("command contains a NUL byte")
    if os.sep in program:
        path = Path(program) if os.path.isabs(program) or cwd is None else Path(cwd) / program
        if not path.exists():
            raise UserError(f"command not found: {program}")
        if path.is_dir():
            raise UserError(f"command is a directory: {program}")
        if not os.access(path, os.X_OK):
            raise UserError(f"command is not executable: {program}")
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath))
        if found is None:
            raise UserError(f"command not found on PATH: {program}")
        path = Path(found)
    _check_format(path, program, env)
    return list(argv)


# ELF e_machine values this machine's kernel runs natively (platform.machine() -> values).
_NATIVE_ELF = {"x86_64": {62, 3}, "i686": {3}, "aarch64": {183, 40}, "armv7l": {40},
               "ppc64le": {21}, "s390x": {22}, "riscv64": {243}}
_BINFMT = Path("/proc/sys/fs/binfmt_misc")


def binfmt_handles(head: bytes) -> bool:
    """Whether an enabled binfmt_misc entry (qemu-user, wine, ...) runs a file whose first
    bytes are `head` (magic entries only; an extension entry matches no head)."""
    try:
        entries = [e for e in _BINFMT.iterdir() if e.name not in ("register", "status")]
    except OSError:
        return False
    for entry in entries:
        try:
            text = entry.read_text()
        except OSError:
            continue
        fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
        if not text.startswith("enabled") or "magic" not in fields:
            continue
        magic = bytes.fromhex(fields["magic"])
        mask = bytes.fromhex(fields.get("mask", "ff" * len(magic)))
        at = int(fields.get("offset", "0"))
        window = head[at:at + len(magic)]
        if len(window) == len(magic) and all(b & m == c & m for b, c, m in zip(window, magic, mask)):
            return True
    return False


def _exec_format_problem(head: bytes) -> str | None:
    """Why the kernel would refuse to execute a file starting with `head` (ENOEXEC), or None:
    neither a #! line nor an ELF header for this machine, and no binfmt_misc entry for it."""
    import platform

    if head.startswith(b"#!"):
        return None
    if head.startswith(b"\x7fELF") and len(head) >= 20:
        native = _NATIVE_ELF.get(platform.machine())
        machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
        if native is None or machine in native or binfmt_handles(head):
            return None
        return f"an ELF program for another machine (e_machine {machine}, this is {platform.machine()})"
    if binfmt_handles(head):
        return None
    return "neither an ELF program for this machine nor a script with a #! line"


def _check_format(path: Path, program: str, env: dict[str, str]) -> None:
    """UserError when the kernel would refuse to start the program (exec format error), or
    a script's `#!` line names an interpreter that is not there: every run an error."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return  # unreadable but executable: the start itself will say
    problem = _exec_format_problem(head)
    if problem:
        raise UserError(f"command {program}: exec format error: {problem} (a script needs a #! line)")
    if not head.startswith(b"#!"):
        return
    head = head.split(b"\n", 1)[0]
    words = head[2:].decode("utf-8", "replace").split()
    if not words:
        raise UserError(f"command {program}: its #! line names no interpreter")
    interpreter = words[0]
    if not (os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)):
        raise UserError(f"command {program}: its interpreter {interpreter} (#! line) does not exist "
                        "or is not executable")
    if Path(interpreter).name == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        if rest and shutil.which(rest[0], path=env.get("PATH", os.defpath)) is None:
            raise UserError(f"command {program}: its interpreter {rest[0]} (#!{' '.join(words)}) is not on PATH")


def check_cwd(cwd: str | os.PathLike[str] | None) -> str | None:
    """`cwd` as a string, or UserError if it is given and is not a directory."""
    if cwd is None:
        return None
    if not Path(cwd).is_dir():
        raise UserError(f"working directory does not exist: {cwd}")
    return os.fspath(cwd)


def check_env(env: dict[str, str] | None) -> dict[str, str]:
    """The child's environment: ours with `env` laid over it (values must be strings)."""
    merged = dict(os.environ)
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not isinstance(value, str) or not key or "=" in key:
            raise UserError(f"bad environment entry {key!r}={value!r}: names and values "
                            "must be strings")
        merged[key] = value
    return merged


def check_timeout(timeout: Any) -> float:
    """A positive, finite timeout in seconds, or UserError."""
    return check_seconds(math.nan if timeout is None else timeout, "timeout")


def check_stall(stall: Any) -> float | None:
    """A stall window: None (off) or a positive, finite number of seconds; UserError otherwise."""
    return check_seconds(stall, "stall window")


def check_grace(grace_s: Any) -> float:
    """A non-negative, finite grace period (SIGTERM to SIGKILL) in seconds, or UserError."""
    return check_seconds(math.nan if grace_s is None else grace_s, "grace period", allow_zero=True)


def check_params(params: Any) -> dict[str, Any]:
    """Run parameters as a dict (None means none), or UserError."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise UserError(f"params must be a mapping, got {type(params).__name__}")
    return dict(params)


def check_launches(launches: Any) -> int | None:
    """A positive integer launch count, None, or UserError."""
    if launches is None:
        return None
    if type(launches) is not int or launches < 1:
        raise UserError(f"launches must be a positive integer, got {launches!r}")
    return launches


def default_name(argv: list[str]) -> str:
    """A target's name when none is given: its command line (bounded)."""
    name = shlex.join(argv)
    return name if len(name) <= _NAME_CHARS else name[:_NAME_CHARS - 3] + "..."


def prepare_artifact_dir(artifact_dir: str | os.PathLike[str] | None) -> Path | None:
    """Create the run's artifact folder if one was asked for; UserError if we cannot."""
    if artifact_dir is None:
        return None
    path = Path(artifact_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create artifact folder {path}: {exc.strerror}") from None
    return path


def run_kw(stall: float | None = None, cutoff: float | None = None) -> dict[str, float]:
    """`stall=` and `cutoff=` for a target's run only when set: targets written before them
    (a test's fake, a user's plugin) keep working without."""
    return {k: v for k, v in (("stall", stall), ("cutoff", cutoff)) if v is not None}


def supported_kw(target: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """The entries of `kw` that `target.run` accepts: a target written before stall windows
    and cutoffs (a test's fake, a user's plugin) runs without them, as it always did."""
    if not kw:
        return kw
    try:
        params = inspect.signature(target.run).parameters
    except (TypeError, ValueError):
        return kw
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kw
    return {k: v for k, v in kw.items() if k in params}


CUT_SHORT = "cut_short"  # error kind of a run the campaign's budget ended (never stored)


def cut_short(name: str, params: dict[str, Any], started_at: float, duration_s: float, what: str = "this run") -> RunResult:
    """The result of a run the campaign's budget ended before it could be judged: not a
    hang (it may have been progressing), not stored (the loop drops it)."""
    return RunResult(Outcome.ERROR, f"the campaign's budget ended {duration_s:.1f} s into {what}: not judged",
                     target=name, variant=str(params.get("variant", "")), params=params,
                     evidence={"error_kind": CUT_SHORT}, started_at=started_at, duration_s=duration_s,
                     error_kind=CUT_SHORT)


class Target(abc.ABC):
    """Something that can be run and judged; one `run` is one RunResult.

    Use as a context manager (or call `close`) so no child outlives the target.
    """

    name: str

    @abc.abstractmethod
    def run(self, params: dict[str, Any] | None = None, *, timeout: float,
            launches: int | None = None, artifact_dir: Path | None = None,
            stall: float | None = None, cutoff: float | None = None) -> RunResult:
        """Run once with `params` under a `timeout` (seconds) and return the judged result;
        with `stall`, a run that stops showing progress for that long is a hang sooner;
        `cutoff` (time.monotonic()) is when the campaign's budget ends: a run still going
        then is given up unjudged (`cut_short`), whatever its timeout."""

    def close(self) -> None:
        """Release every process this target started (no-op by default)."""

    def __enter__(self) -> "Target":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WrapperTarget(Target):
    """A target that runs another one and adds to its results (a tripwire diagnosis, a
    sanitizer report, kernel-log Xid lines...).

    Subclasses override `run` and call `self.inner.run(...)` inside it. Closing the
    wrapper closes the inner target; attributes the wrapper does not have (a server's
    `start`, `gpu_uuid`, `spawns`...) are the inner target's, so wrappers stack freely.
    """

    def __init__(self, inner: Target, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or getattr(inner, "name", type(inner).__name__)

    def run(self, params: dict[str, Any] | None = None, *, timeout: float,
            launches: int | None = None, artifact_dir: Path | None = None,
            stall: float | None = None, cutoff: float | None = None) -> RunResult:
        """Run the inner target unchanged (subclasses add their part around this)."""
        return self.inner.run(params, timeout=timeout, launches=launches, artifact_dir=artifact_dir,
                              **supported_kw(self.inner, run_kw(stall, cutoff)))

    def close(self) -> None:
        """Close the inner target (and with it every process it started)."""
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found normally; `inner` itself must exist first
        # (copy/pickle probe attributes before __init__ has run).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
