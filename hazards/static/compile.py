"""Compiler and disassembler invocation for the static checks, cached by content.

The checks read what the compiler really emitted: AMDGCN assembly from clang
(`-x hip --offload-arch=gfx942 -nogpulib -nogpuinc --cuda-device-only -O3 -S`; clang-19 for
gfx942, clang-22 for gfx950: `toolchain.find_tool("clang", arch=...)`), cubins and
PTX from nvcc, SASS from nvdisasm/cuobjdump. Finding the tools, their flags, the cache key
and the cache folder are `hazards.engine.toolchain`'s job: a tool that is not installed
raises `ToolchainMissing` naming what to install. More in docs/static-checks.md.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

from hazards.engine import toolchain
from hazards.engine.classify import signal_name
from hazards.engine.errors import NotJudged, ToolchainMissing, UserError
from hazards.engine.build import target_flags
from hazards.engine.proctree import run_in_group
from hazards.kernel_sources import standalone_dir

# Every family source compiled for the static checks sees this define: it selects the
# two-line attribute shim instead of <hip/hip_runtime.h>, which -nogpuinc leaves out.
STATIC_DEFINE = "HZ_STATIC_ONLY"


@dataclasses.dataclass(frozen=True)
class Build:
    """One compiler output: the artifact on disk, its text (for listings) and the log."""

    path: Path
    text: str
    log: str
    command: tuple[str, ...]


def _define_args(defines: Mapping[str, object] | None) -> list[str]:
    args = []
    for k, v in sorted((defines or {}).items()):
        args.append(f"-D{k}" if v is None or v is True else f"-D{k}={v}")
    return args


class ToolKilled(NotJudged):
    """A compiler or disassembler ended before it finished, by a signal or at its time limit:
    it said nothing about the source, so what it was to build could not be judged (exit 3),
    which is not bad input."""


def run_tool(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    """Run a compiler or disassembler with the toolchain's time limit; a failure is a
    UserError naming the command and the end of its output, a tool ended by a signal or
    killed at the time limit a `ToolKilled` naming the command."""
    try:  # its own process group, killed whole on a timeout (nvcc's cicc, ptxas, gcc with it)
        proc = run_in_group(cmd, toolchain.COMPILE_TIMEOUT_S, text=True)
    except subprocess.TimeoutExpired as e:
        raise ToolKilled(f"{what} timed out after {toolchain.COMPILE_TIMEOUT_S:g} s (killed at the time "
                         f"limit; nothing judged): {' '.join(cmd)}") from e
    if proc.returncode < 0:
        raise ToolKilled(f"{what} was ended by {signal_name(-proc.returncode)} before it finished (the OOM "
                         f"killer, a kill or a stop; nothing judged): {' '.join(cmd)}")
    if (child := _child_signal(proc.returncode)) is not None:
        # the OOM killer ends the largest process, nvcc's cicc or ptxas: nvcc then exits 128 + N
        # ("Killed"), which is no compile error of the source
        raise ToolKilled(f"{what} exited {proc.returncode}: a process it ran was ended by {child} before it "
                         f"finished (the OOM killer, a kill or a stop; nothing judged): {' '.join(cmd)}")
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        first = next((ln for ln in lines if DIAGNOSTIC_ERROR.search(ln)), None)
        tail = lines[-15:]
        if first is not None and first not in tail:  # the first error, however long the log
            tail = [first, "...", *tail]
        raise UserError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))
    return proc


# The signal numbers Python has a name for (on Linux 1-31, SIGRTMIN 34 and SIGRTMAX 64).
_NAMED_SIGNALS = frozenset(int(s) for s in signal.Signals)


def _child_signal(returncode: int) -> str | None:
    """The signal a shell's 128 + N exit status names (a compiler driver whose child was killed
    exits so), else None; an N with no name is no signal here. Errors exit 1 or 2 (nvcc, nvdisasm,
    clang), a shell's 'not found' 127, -1 is 255."""
    named = 128 < returncode < 256 and returncode - 128 in _NAMED_SIGNALS
    return signal_name(returncode - 128) if named else None


# A compiler's error line (not a source line quoted under it): clang `file:1:2: error:`,
# `clang-19: error:`, nvcc `file(12): error:`, `nvcc fatal`.
DIAGNOSTIC_ERROR = re.compile(r"^(?:\S.*?:\d+:\d+: (?:fatal )?error: |\S.*?\(\d+\): (?:catastrophic )?error: |"
                              r"clang(?:-\d+)?: error: |nvcc (?:fatal|error))")


def _cached_build(tool: str, args: list[str], source: Path, suffix: str, label: str,
                  out_flag: str = "-o", key_extra: str = "") -> Build:
    """Run `tool args source -o out` unless the same build is already cached (`key_extra`:
    more text the output depends on, e.g. every header a user build reads)."""
    include_dirs = [Path(a[2:]) for a in args if a.startswith("-I")]
    files = toolchain.included_files(source, include_dirs)
    # Keyed relative to the kernel sources, so a wheel installed anywhere shares the checkout's
    # builds - unless the output names the sources' paths: then by their absolute paths (and
    # -I folders), so a second checkout never maps its findings through the first one's files.
    root = None if toolchain.names_its_sources(args) else standalone_dir()
    key = toolchain.cache_key(files, [tool, *args, *([key_extra] if key_extra else [])],
                              toolchain.tool_version(tool), root=root)
    out = toolchain.cache_dir("static") / f"{label}-{key[:16]}{suffix}"
    log_path = out.with_suffix(out.suffix + ".log")

    def compile_to(tmp: Path) -> None:
        proc = run_tool([tool, *args, str(source), out_flag, str(tmp)], label)
        log_path.write_text(proc.stderr)

    toolchain.cached_output(out, compile_to)
    log = log_path.read_text() if log_path.exists() else ""
    body = out.read_text(errors="replace") if suffix in (".s", ".ptx", ".i") else ""
    return Build(out, body, log, (tool, *args, str(source), out_flag, str(out)))


def _with_text(source: Path, text: str | None) -> Path:
    """The file to hand the compiler: `source` itself, or a copy holding `text` in the
    cache (quoted includes still resolve: the caller passes `-I` the source's folder)."""
    if text is None:
        return source
    tmpdir = toolchain.cache_dir("static") / "src"
    tmpdir.mkdir(exist_ok=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    copy = tmpdir / f"{source.stem}-{digest}{source.suffix}"
    if not copy.exists():
        fd, tmp = tempfile.mkstemp(dir=tmpdir, suffix=source.suffix)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, copy)
    return copy


def compile_amdgcn(source: Path, *, arch: str = toolchain.GFX942,
                   defines: Mapping[str, object] | None = None, text: str | None = None,
                   label: str | None = None, extra_args: tuple[str, ...] = (),
                   device_libs: tuple[str, ...] = ("-nogpulib",)) -> Build:
    """AMDGCN assembly for `source` (or for `text` in place of its contents).

    `HZ_STATIC_ONLY` is always defined; quoted includes resolve next to `source`;
    `device_libs` are the flags for ROCm's device libraries (default: none).
    """
    clang = toolchain.find_tool("clang", needed_for="for the AMDGCN static checks", arch=arch)
    src = _with_text(Path(source), text)
    base = [f for f in toolchain.AMD_DEVICE_ONLY_FLAGS if f != "-nogpulib"]
    args = [*base, *device_libs, "-O3", "-S", toolchain.amd_arch_flag(arch),
            f"-D{STATIC_DEFINE}", f"-I{Path(source).resolve().parent}", *_define_args(defines), *extra_args]
    return _cached_build(clang, args, src, ".s", label or f"{Path(source).stem}-{arch}")


def preprocess(source: Path, *, defines: Mapping[str, object] | None = None,
               label: str | None = None) -> Build:
    """The preprocessed text of `source` (line markers kept, so lines map back)."""
    clang = toolchain.find_tool("clang", needed_for="to preprocess for the source lint")
    args = ["-E", "-x", "c++", f"-D{STATIC_DEFINE}", *_define_args(defines)]
    src = Path(source)
    return _cached_build(clang, args, src, ".i", label or f"{src.stem}-pp")


def compile_cubin(source: Path, *, arch: str = toolchain.SM90A,
                  defines: Mapping[str, object] | None = None, label: str | None = None,
                  extra_args: tuple[str, ...] = (), key_extra: str = "", harness_flags: bool = False) -> Build:
    """A cubin for `source` built with `nvcc -cubin -O3` for `arch`; `log` is ptxas' stderr.
    `harness_flags`: with a family harness build's flags instead (stress.build.target_flags:
    -split-compile=0 and -lineinfo among them, which change the machine code), so the cubin's
    code is the family binary's that the GPU runs."""
    nvcc = toolchain.find_tool("nvcc", needed_for="for the NVIDIA static checks")
    src = Path(source)
    flags = target_flags(arch) if harness_flags else (*toolchain.nvcc_arch_flags(arch), "-O3")
    args = ["-cubin", *flags, *_define_args(defines), *extra_args]
    return _cached_build(nvcc, args, src, ".cubin", label or f"{src.stem}-{arch}", key_extra=key_extra)


def compile_ptx(source: Path, *, arch: str = toolchain.SM90A,
                defines: Mapping[str, object] | None = None, label: str | None = None,
                extra_args: tuple[str, ...] = (), harness_flags: bool = False) -> Build:
    """The PTX nvcc emits for `source` (`extra_args`: e.g. `-I` folders, which enter the key);
    `harness_flags`: with a family harness build's flags, as compile_cubin takes them."""
    nvcc = toolchain.find_tool("nvcc", needed_for="for the NVIDIA static checks")
    src = Path(source)
    flags = target_flags(arch) if harness_flags else (*toolchain.nvcc_arch_flags(arch), "-O3")
    args = ["-ptx", *flags, *_define_args(defines), *extra_args]
    return _cached_build(nvcc, args, src, ".ptx", label or f"{src.stem}-{arch}")


def require_sass_tools() -> None:
    """ToolchainMissing unless nvcc and a disassembler may be used now (installed, and not
    skipped with `--skip`): for a caller that keeps compiled output in memory, so that a cache
    hit never judges what the user asked to skip."""
    toolchain.find_tool("nvcc", needed_for="for the NVIDIA static checks")
    try:
        toolchain.find_tool("nvdisasm", needed_for="for the SASS checks")
    except ToolchainMissing as missing:
        if missing.skipped:
            raise
        try:
            toolchain.find_tool("cuobjdump", needed_for="for the SASS checks")
        except ToolchainMissing:
            raise missing from None


def disassemble(cubin: Path) -> Build:
    """SASS text of a cubin (nvdisasm -c -gi, with line info and inlining where the cubin has it;
    cuobjdump -sass when nvdisasm is absent). The listing is kept in the build cache under
    a name keyed by the cubin's bytes: never written next to the cubin (a user's file of
    that name is never overwritten) and never stale."""
    try:
        # -gi: line info with the inlining chain (compiled mode reports code of an inline
        # helper at each call site)
        tool, args = toolchain.find_tool("nvdisasm", needed_for="for the SASS checks"), ["-c", "-gi"]
    except ToolchainMissing as missing:
        if missing.skipped:  # --skip nvdisasm skips the SASS checks, not just one disassembler
            raise
        try:
            tool, args = toolchain.find_tool("cuobjdump", needed_for="for the SASS checks"), ["-sass"]
        except ToolchainMissing:
            raise missing from None  # neither: name the preferred one
    cubin = Path(cubin)
    try:
        digest = hashlib.sha256(cubin.read_bytes()).hexdigest()[:16]
    except OSError as e:
        raise UserError(f"cannot read {cubin}: {e.strerror or e}") from None
    listing = toolchain.cache_dir("static") / f"{cubin.stem}-{digest}-{Path(tool).name}{''.join(args)}.sass"
    cmd = (tool, *args, str(cubin))

    def disassemble_to(tmp: Path) -> None:
        tmp.write_text(run_tool(list(cmd), Path(tool).name).stdout)

    toolchain.cached_output(listing, disassemble_to)
    return Build(listing, listing.read_text(errors="replace"), "", cmd)
