"""What several commands share: their common options, the parsers of option values, helpers.

One spelling, one meaning and one help text per flag. A command declares a shared option by its
type, e.g. `store_path: StoreOption = None`; the default stays in the command's signature,
where a reader looks for it. The four options of a leased campaign (--store, --lease-dir,
--wait, --exclusive) come as one parameter, `lease: LeaseFlags = LeaseFlags(wait="60s")`, that
`@lease_options` spells out for typer; the four of a hang (--forensics, --hang-budget,
--forensics-share, --stall) likewise, as `hang: HangFlags = HangFlags(...)` with
`@hang_options`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import math
import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Iterator, List, Optional

import typer

from hazards.engine.errors import UserError, check_seconds
from hazards.engine.forensics.policy import DEFAULT_HANG_BUDGET_S, DEFAULT_SHARE

def literal(text: Any) -> str:
    """User- or data-supplied text for a rich console, shown as it is: its square brackets
    escaped (rich markup would eat `[fp16-sm90]` in `test_gemm[fp16-sm90]`), its non-UTF-8
    bytes (arguments pass through with surrogateescape) escaped as `\\xff`."""
    from rich.markup import escape

    from hazards.engine.store import storable_text

    return escape(storable_text(str(text)))


# The built-in default of an option that `[tool.hazards]` may set (hazards/cli/project_defaults.py):
# click shows a file value for an option whose default is a value (--budget), but a
# `show_default` text as it is, so the text says where the file value would come from.
def project_default(builtin: str, key: str) -> str:
    """`show_default` words: the project's pyproject.toml value for `key`, else `builtin`."""
    return f"{builtin}, or pyproject.toml's tool.hazards {key}"


StoreOption = Annotated[Optional[Path], typer.Option(
    "--store", envvar="HZ_STORE", help="Results database.",
    show_default=project_default(".hazards/results.db", "store"))]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
CommandArgument = Annotated[Optional[List[str]], typer.Argument(
    help="The program and its arguments (after --).", show_default=False)]
FamiliesOption = Annotated[Optional[List[str]], typer.Option(
    "--families", envvar="HZ_FAMILIES", help="Only these families (repeat or comma-separate).",
    show_default=project_default("all", "families"))]
BudgetOption = Annotated[str, typer.Option("--budget", envvar="HZ_BUDGET", help="Time budget (e.g. 90s, 3m, 1h30m).")]
LeaseDirOption = Annotated[Optional[Path], typer.Option(
    "--lease-dir", help="GPU lease folder.", show_default="$HZ_LEASE_DIR or /tmp/gpu-hazards-leases")]
WaitOption = Annotated[str, typer.Option("--wait", help="How long to wait for a GPU leased by someone else.")]
ExclusiveOption = Annotated[bool, typer.Option(
    "--exclusive", help="Refuse GPUs that run compute processes of others (NVML).")]
FamilyOption = Annotated[Optional[str], typer.Option(
    "--family", show_default="none: run CMD", help="Run a catalog family's binary instead of CMD.")]
CampaignNameOption = Annotated[Optional[str], typer.Option(
    "--name", help="Name for the campaign.", show_default="none")]
ResumeOption = Annotated[Optional[int], typer.Option(
    "--resume", help="Continue this campaign (by id).", show_default="a new campaign")]
JUnitOption = Annotated[Optional[Path], typer.Option(
    "--junit", help="Also write the result as JUnit XML to this file.", show_default="none")]
ConfOption = Annotated[float, typer.Option("--conf", help="Confidence level of the intervals.")]
SkipOption = Annotated[Optional[List[str]], typer.Option(
    "--skip", envvar="HZ_SKIP", show_default=project_default("nothing", "skip"),
    help="What not to check, reported as skipped (never as passed): `gpu` or `static` (the parts of "
         "`hazards check`), or a tool the static checks use (clang, nvcc, nvdisasm), installed or not. "
         "Without it, a check that cannot run exits 3. Repeat or comma-separate.")]
CHECK_PARTS = ("gpu", "static")
VerboseOption = Annotated[bool, typer.Option("-v", "--verbose", help="Print more detail.")]
ProgressIntervalOption = Annotated[str, typer.Option(
    "--progress-interval", envvar="HZ_PROGRESS_INTERVAL",
    help="How often a status line is written when stderr is not a terminal (CI logs), e.g. 30s or 2m; "
         "0 turns progress off.")]
DryRunOption = Annotated[bool, typer.Option(
    "--dry-run", help="Check the input and print the plan (items, budget, what would be skipped), then exit "
                      "0; no GPU, no build, nothing stored.")]
MaxErrorsInARowOption = Annotated[int, typer.Option(
    "--max-errors-in-a-row",
    help="Stop after this many runs in a row end in `error` (the check itself failing, e.g. an import "
         "error); 0 never stops.")]
ForensicsOption = Annotated[bool, typer.Option(
    "--forensics/--no-forensics",
    help="On a hang, before the kill, read where it is stuck (host stacks, device warps, GPU state): a full "
         "collection for an item's first hang or a new stuck location, a summary (py-spy, tripwire) after, "
         "within --forensics-share of the budget.")]
HangBudgetOption = Annotated[float, typer.Option("--hang-budget", help="Seconds the on-hang collectors may take per hang.")]
ForensicsShareOption = Annotated[float, typer.Option(
    "--forensics-share", help="The most of the campaign's budget (or of its runs' timeouts) all hangs' "
                              "collectors may take together, 0-1 (the campaign's first full collection may exceed it).")]
StallOption = Annotated[str, typer.Option(
    "--stall", help="A run that showed progress (HZ_PROGRESS lines, a family's heartbeat, its tripwire: "
                    "docs/stall.md) and then none for this long is a hang, long before --timeout: a duration "
                    "(e.g. 1.5s), `off` (the timeout alone), or `auto` (calibrated per item from its clean runs "
                    "in the store; a family's server starts at the measured floor).")]
# One meaning of --arch for every command (a command builds for one target or, repeated, several).
ARCH_HELP = "GPU architecture to build for (sm_90a; gfx942 where a HIP compiler exists)."


def runs_option(default: str) -> Any:
    """-n/--runs: how many runs a campaign makes at most (a stop at the first failure ends it sooner)."""
    return typer.Option("-n", "--runs", show_default=default,
                        help="Runs to make (at most: a stop at the first failure ends sooner).")


def timeout_option(default: str) -> Any:
    """--timeout: seconds one run may take before it is judged a hang."""
    return typer.Option("--timeout", show_default=default, help="Seconds a run may take before it is a hang.")


def variant_option(default: str) -> Any:
    """--variant: the family variant(s) to run."""
    return typer.Option("--variant", show_default=default, help="Family variant to run.")


def launches_option(default: str) -> Any:
    """--launches: kernel launches per run (one batch on a family's server)."""
    return typer.Option("--launches", "-l", show_default=default, help="Kernel launches per run.")
# The user's build, for the static checks of their sources (macro expansion, compiled mode).
# --build: bisect builds each commit's checkout (run in it), mutate each mutant's copy ({dir},
# {src}, {out} filled in): one flag, one meaning - the shell command that builds what is judged.
BuildOption = Annotated[Optional[str], typer.Option(
    "--build", show_default="none",
    help="Shell command that builds what is judged: bisect, a commit's checkout (run in it); mutate, "
         "a mutant's copy ({dir}, {src} and {out} filled in).")]
IncludeOption = Annotated[Optional[List[Path]], typer.Option(
    "-I", "--include-dir", help="An include folder of the sources' build (repeat).", show_default="none")]
DefineOption = Annotated[Optional[List[str]], typer.Option(
    "-D", "--define", help="A define of the sources' build, NAME or NAME=VALUE (repeat).", show_default="none")]
RocmPathOption = Annotated[Optional[Path], typer.Option(
    "--rocm-path", help="A ROCm installation to compile HIP sources with (its headers and device "
    "libraries; sets ROCM_PATH).", show_default="$ROCM_PATH, else the system's HIP headers")]
Hip6CompatOption = Annotated[bool, typer.Option(
    "--hip6-compat", help="Compile HIP sources written for ROCm 6 with an older HIP (Debian's 5.2): "
    "the project's own stand-ins for what it lacks (hip_bf16.h, hip_fp8.h, a few host-API names) "
    "and the headers installed wheels carry (triton's AMD backend, PyTorch's c10), after the "
    "system's. An approximation of a ROCm 6 build; a real HIP header always wins.")]
CompileCommandsOption = Annotated[Optional[Path], typer.Option(
    "--compile-commands", help="The build's compile_commands.json (flags per source).",
    show_default="the nearest compile_commands.json above each source")]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smh]?)")


@dataclasses.dataclass(frozen=True)
class LeaseFlags:
    """Where a leased campaign keeps its results and how it leases GPUs: the values of
    --store, --lease-dir, --wait and --exclusive (`lease_options` declares them)."""

    store_path: Optional[Path] = None
    lease_dir: Optional[Path] = None
    wait: str = "0s"
    exclusive: bool = False

    @property
    def lock_dir(self) -> str | None:
        """The lease folder as the engine takes it (None: its default)."""
        return str(self.lease_dir) if self.lease_dir else None

    @property
    def wait_s(self) -> float:
        """--wait in seconds (0 allowed: do not wait)."""
        return parse_duration(self.wait, allow_zero=True)


_LEASE_OPTIONS = {"store_path": StoreOption, "lease_dir": LeaseDirOption, "wait": WaitOption,
                  "exclusive": ExclusiveOption}


@dataclasses.dataclass(frozen=True)
class HangFlags:
    """What a campaign does about a hang: the values of --forensics, --hang-budget,
    --forensics-share and --stall (`hang_options` declares them)."""

    forensics: bool = True
    hang_budget: float = DEFAULT_HANG_BUDGET_S
    forensics_share: float = DEFAULT_SHARE
    stall: str = "auto"

    def policy(self, *, known_canary: str = "summary") -> Any:
        """The campaign's ForensicsPolicy (None with --no-forensics); UserError out of range."""
        return forensics_policy(self.forensics, self.hang_budget, self.forensics_share, known_canary=known_canary)

    @property
    def stall_setting(self) -> str | float:
        """--stall as the engine takes it: 'auto', 'off' or seconds; UserError otherwise."""
        return parse_stall(self.stall)


_HANG_OPTIONS = {"forensics": ForensicsOption, "hang_budget": HangBudgetOption,
                 "forensics_share": ForensicsShareOption, "stall": StallOption}


def _option_group(param: str, flags_type: type, options: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator that gives a command the `options` where its signature has
    `PARAM: FLAGS_TYPE = FLAGS_TYPE(...)` (whose fields are the options' defaults), and passes
    their values to it as that one object.

    Typer reads a command's options from its signature, so the returned command's signature
    names the options in the place of PARAM, and its help lists them there."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        defaults = signature.parameters[param].default
        if not isinstance(defaults, flags_type):
            raise TypeError(f"{command.__name__}: `{param}` needs a {flags_type.__name__} default")
        flags = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=getattr(defaults, name),
                                   annotation=option) for name, option in options.items()]
        params = [q for p in signature.parameters.values()
                  for q in (flags if p.name == param else [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)])]

        @functools.wraps(command)
        def with_flags(**kwargs: Any) -> Any:
            grouped = flags_type(**{name: kwargs.pop(name) for name in options})
            return command(**kwargs, **{param: grouped})

        with_flags.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return with_flags

    return decorate


# `lease: LeaseFlags = LeaseFlags(...)` becomes --store, --lease-dir, --wait and --exclusive.
lease_options = _option_group("lease", LeaseFlags, _LEASE_OPTIONS)
# `hang: HangFlags = HangFlags(...)` becomes --forensics, --hang-budget, --forensics-share and --stall.
hang_options = _option_group("hang", HangFlags, _HANG_OPTIONS)


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """Seconds from '90', '90s', '3m', '1h30m', '1.5h'; UserError for anything else."""
    s = (text or "").strip().lower()
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos or (not m.group(2) and m.end() != len(s)):
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise UserError(f"cannot read duration {text!r} (use e.g. 90s, 3m, 1h30m)")
    if total <= 0 and not allow_zero:
        raise UserError(f"duration must be positive, got {text!r}")
    return total


def progress_interval(text: str) -> float:
    """Seconds of `--progress-interval` ('30s', '2m', '0' for no progress); UserError otherwise."""
    try:
        return parse_duration(text, allow_zero=True)
    except UserError as e:
        raise UserError(f"--progress-interval: {e}") from None


def parse_stall(text: str | None) -> str | float:
    """`--stall`: 'auto', 'off' (also 0) or positive seconds of a duration; UserError otherwise."""
    from hazards.engine.stall import AUTO, OFF

    s = (text or AUTO).strip().lower()
    if s in (AUTO, OFF):
        return s
    try:
        seconds = parse_duration(s, allow_zero=True)
    except UserError as e:
        raise UserError(f"--stall: {e}, or auto, or off") from None
    return OFF if seconds == 0 else check_seconds(seconds, "--stall")


def forensics_policy(enabled: bool, hang_budget: float, share: float, *, known_canary: str = "summary") -> Any:
    """The campaign's ForensicsPolicy from --forensics/--hang-budget/--forensics-share (None
    with --no-forensics); UserError for a budget or share out of range."""
    from hazards.engine.forensics.policy import ForensicsPolicy

    check_seconds(hang_budget, "--hang-budget")
    if not (math.isfinite(share) and 0 < share <= 1):
        raise UserError(f"--forensics-share must be a share of the budget in (0, 1], got {share:g}")
    return ForensicsPolicy(hang_budget_s=hang_budget, share=share, known_canary=known_canary) if enabled else None


def use_hip6_compat(on: bool) -> None:
    """`--hip6-compat`: HIP builds get the ROCm 6 stand-ins (`$HZ_HIP6_COMPAT`, read by
    hazards.static.userbuild.hip_device_args)."""
    from hazards.static.userbuild import HIP6_COMPAT_ENV

    if on:
        os.environ[HIP6_COMPAT_ENV] = "1"


def use_rocm_path(path: Optional[Path]) -> None:
    """`--rocm-path DIR`: the ROCm the HIP builds use (ROCM_PATH, read by
    hazards.static.userbuild.rocm_path); a folder that does not exist is a UserError."""
    if path is None:
        if os.environ.get("ROCM_PATH") and not Path(os.environ["ROCM_PATH"]).is_dir():
            from hazards.engine.errors import UserError

            raise UserError(f"ROCM_PATH={os.environ['ROCM_PATH']} is not a folder (a ROCm installation, e.g. /opt/rocm)")
        return
    if not Path(path).is_dir():
        from hazards.engine.errors import UserError

        raise UserError(f"--rocm-path {path}: not a folder (a ROCm installation, e.g. /opt/rocm)")
    os.environ["ROCM_PATH"] = str(Path(path).resolve())


def build_flags(includes: Optional[Iterable[Path]], defines: Optional[Iterable[str]]) -> list[str]:
    """-I/-D options as compiler flags (include folders made absolute)."""
    return [f"-I{Path(d).resolve()}" for d in includes or ()] + [f"-D{d}" for d in defines or ()]


_MACRO_NAME = re.compile(r"[A-Za-z_]\w*")


def _macro_items(items: Optional[Iterable[str]], flag: str, form: str) -> list[tuple[str, str | None]]:
    """The (NAME, VALUE or None) of -D/-U items, repeated and/or comma-separated, stripped, in order;
    UserError, one line, naming `flag`, for an empty item (`,`, `A,,B`) and for an item without a name
    (`=`, `=5`) or with a bad one. `form` is how an item is written (the errors say it)."""
    parts = [d.strip() for item in items or () for d in item.split(",")]
    if any(not d for d in parts):
        raise UserError(f"{flag}: an empty item (write {form}, comma-separated)")
    out = []
    for d in parts:
        name, eq, value = d.partition("=")
        if not name.strip():
            raise UserError(f"{flag}: {d!r} has no name (write {form})")
        if not _MACRO_NAME.fullmatch(name):
            raise UserError(f"{flag}: not a macro name: {name!r}")
        out.append((name, value if eq else None))
    return out


def parse_define_items(items: Optional[Iterable[str]]) -> dict[str, str]:
    """-D/--define items (repeated and/or comma-separated), NAME or NAME=VALUE, as {NAME: VALUE} (NAME
    alone: "1"), in order. UserError, one line, for an empty item (`-D ,`, `-D A,,B`), for an item
    without a name (`-D =`, `-D =5`) or with a bad one, and for NAME= (C's -DNAME= defines NAME as empty,
    which would read as 1: another build's code). The one reading of -D for the commands that take it
    (repro, mutate)."""
    out: dict[str, str] = {}
    for name, value in _macro_items(items, "-D/--define", "NAME or NAME=VALUE"):
        if value == "":
            raise UserError(f"-D/--define: {name + '='!r} has no value (write NAME=VALUE, or NAME alone for 1)")
        out[name] = "1" if value is None else value
    return out


def parse_undefine_items(items: Optional[Iterable[str]]) -> list[str]:
    """-U/--undefine items (repeated and/or comma-separated, as -D reads them: parse_define_items), each a
    macro name alone, as the names in order, each once. UserError, one line, for an empty item, an item
    without a name or with a bad one, and for NAME=VALUE (-U takes no value: `-U A=1` would otherwise leave
    A undefined, or define it, without a word)."""
    out: list[str] = []
    for name, value in _macro_items(items, "-U/--undefine", "NAME"):
        if value is not None:
            raise UserError(f"-U/--undefine: {name + '=' + value!r}: -U takes a macro name alone (write NAME)")
        if name not in out:
            out.append(name)
    return out


def split_names(values: Optional[Iterable[str]]) -> list[str]:
    """Names from repeated and/or comma-separated options."""
    return [n.strip() for v in values or () for n in v.split(",") if n.strip()]


def parse_skip(values: Optional[Iterable[str]], parts: tuple[str, ...] = CHECK_PARTS) -> tuple[set[str], set[str]]:
    """(parts, tools) named by `--skip`; UserError listing what may be named otherwise."""
    from hazards.engine.toolchain import TOOLS

    got_parts, tools = set(), set()
    for name in split_names(values):
        if name in parts:
            got_parts.add(name)
        elif name in TOOLS and TOOLS[name].skippable:
            tools.add(name)
        else:
            skippable = [t for t, tool in TOOLS.items() if tool.skippable]
            raise UserError(f"--skip {name}: nothing of that name (give {', '.join((*parts, *skippable))})")
    return got_parts, tools


def print_plan(plan: Any, as_json: bool) -> None:
    """A `--dry-run` plan (`hazards.plan.Plan`) as text lines or one JSON object on stdout."""
    if as_json:
        typer.echo(json.dumps(plan.to_json()))
        return
    for line in plan.lines():
        typer.echo(line)


def print_findings(findings: Iterable[Any], as_json: bool, show_info: bool) -> None:
    """Static-check findings as text lines or one JSON array (`info` ones only if asked)."""
    from hazards.static.findings import to_json

    shown = [f for f in findings if show_info or f.severity != "info"]
    if as_json:
        typer.echo(to_json(shown))
        return
    for f in shown:
        typer.echo(f.format())


# Signals that end a command like Ctrl-C: a batch system's stop, an ssh drop, a quit key.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived (it unwinds like Ctrl-C: finished runs kept, children stopped,
    the campaign marked interrupted); the command exits 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def say_interrupted(command: str, campaign_id: int | None, store_path: Path | None) -> None:
    """The line a campaign command prints when Ctrl-C (or a stop signal) ends it: that the
    finished runs are kept, and the exact command that continues the campaign."""
    store = f" --store {shlex.quote(str(store_path))}" if store_path is not None else ""
    kept = (f"campaign {campaign_id} keeps every finished run (continue with "
            f"`hazards {command} --resume {campaign_id}{store}`)" if campaign_id is not None else "no run had started")
    try:
        print(f"hazards: interrupted; {kept}", file=sys.stderr)
    except OSError:  # the terminal hung up (SIGHUP)
        pass


def interrupt_exit_code(exc: BaseException) -> int:
    """128 + the signal that interrupted: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP, 131 SIGQUIT."""
    return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)


@contextlib.contextmanager
def stop_signals_as_interrupt() -> Iterator[dict[str, int]]:
    """Within: SIGTERM, SIGHUP and SIGQUIT end a command like Ctrl-C (`Interrupted`). Yields
    {"signum": N} once one arrived (typer turns the interrupt into exit code 130, so the
    caller reads the signal here)."""
    seen: dict[str, int] = {}

    def interrupt(signum: int, frame: object) -> None:
        seen.setdefault("signum", signum)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
