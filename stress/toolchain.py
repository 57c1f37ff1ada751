"""The one home of the toolchain: tools, GPU-target flags, versions, cache keys, the build cache.

- `find_tool(name)`: nvcc, hipcc, clang (with the AMDGPU backend), cpp, nvdisasm, cuobjdump.
  An `HZ_<TOOL>` variable overrides the lookup (HZ_NVCC, HZ_HIPCC, HZ_CLANG, HZ_CPP,
  HZ_NVDISASM, HZ_CUOBJDUMP); a missing tool raises `ToolchainMissing` naming the tool and how to
  install it. `find_tool("clang", arch=...)` is the first clang that compiles for that AMD
  target: clang-19 for gfx942 (the release the checks were first measured on), clang-22
  for gfx950 (clang-19 rejects the processor; Debian 12 ships clang-22 in
  bookworm-security). Within `skipping(names)` (the static checks under `--skip TOOL`) those tools
  are not used even where installed: `ToolchainMissing(skipped=True)`.
- The GPU targets' flags are spelled here once: `SM90A` / `nvcc_arch_flags()` for NVIDIA
  (`-gencode=arch=compute_90a,code=sm_90a`), `GFX942` / `amd_arch_flag()` for AMD
  (`--offload-arch=gfx942`), and the clang flags of AMD device-only static builds.
- `tool_version(path)` is the part of `--version` that names the release, and
  `cache_key(...)` hashes that version, the arguments and the text of every source file a
  build reads (the main file and everything it reaches through `#include "..."`), named
  relative to a `root` (the kernel sources: an installed package shares a checkout's
  builds) when the caller passes one. The static checks' builds pass none where the build
  `names_its_sources(args)` (line tables, preprocessor line markers): absolute paths, so a
  second checkout gets its own build; the family binaries pass `root` anyway (docs/harness.md).
- `cache_dir(kind)`: the per-user build cache, `$HZ_BUILD_DIR` or
  `$XDG_CACHE_HOME/gpu-hazards` or `~/.cache/gpu-hazards`, one folder per kind of build
  ("family", "static", "megakernel"). Nothing is ever written into the installed package or
  into the current folder. `cached_output(path, produce)` fills one cache entry atomically,
  with a file lock so that concurrent builders of one key share one compile.
More in docs/harness.md.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import psutil
from filelock import FileLock

from .errors import ToolchainMissing, UserError
from .proctree import cache_unless_killed, run_in_group

SM90A = "sm_90a"
GFX942 = "gfx942"
GFX950 = "gfx950"
AMD_ARCHS = (GFX942, GFX950)  # MI300 (CDNA3), MI350/MI355 (CDNA4): every HIP family builds for both
# clang flags of an AMD device-only build without ROCm installed (static checks: -S listings).
AMD_DEVICE_ONLY_FLAGS: tuple[str, ...] = ("-x", "hip", "-nogpulib", "-nogpuinc", "--cuda-device-only")
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".c", ".cc", ".cpp", ".inc", ".hip")
# One compile may take minutes (mma_pingpong's wgmma instantiations: ~1 min of CPU, several
# on a loaded machine); past this it is a hang, not a slow compile.
COMPILE_TIMEOUT_S = 900.0


def nvcc_arch_flags(arch: str = SM90A) -> tuple[str, ...]:
    """nvcc flags that compile for one real architecture (`sm_90a` -> compute_90a SASS)."""
    m = re.fullmatch(r"sm_(\d+[a-z]?)", arch)
    if not m:
        raise UserError(f"not an NVIDIA architecture: {arch!r} (e.g. {SM90A})")
    return (f"-gencode=arch=compute_{m.group(1)},code={arch}",)


def amd_arch_flag(arch: str = GFX942) -> str:
    """The clang/hipcc flag that compiles device code for one AMD architecture."""
    if not re.fullmatch(r"gfx[0-9a-f]+", arch):
        raise UserError(f"not an AMD architecture: {arch!r} (e.g. {GFX942})")
    return f"--offload-arch={arch}"


# ----------------------------------------------------------------------------- tools --
def _cuda_homes() -> list[Path]:
    return [Path(h) / "bin" for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                                      "/usr/local/cuda") if h]


def _nvidia_wheel_bins() -> list[Path]:
    """`nvidia/*/bin` of the pip wheels (nvidia-cuda-nvdisasm, nvidia-cuda-cuobjdump)."""
    try:
        import nvidia  # namespace package installed by the nvidia-cuda-* wheels
    except ImportError:
        return []
    return sorted(p for root in nvidia.__path__ for p in Path(root).glob("*/bin"))


def _has_amdgpu_backend(path: str) -> bool:
    try:
        out = run_in_group([path, "-print-targets"], 30, text=True).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "amdgcn" in out


@cache_unless_killed
def _clang_targets(path: str, arch: str) -> bool:
    """Whether clang at `path` compiles device code for `arch` (an empty HIP unit)."""
    try:
        proc = run_in_group([path, *AMD_DEVICE_ONLY_FLAGS, amd_arch_flag(arch), "-S", "-", "-o", os.devnull],
                            60, input="", text=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


@dataclasses.dataclass(frozen=True)
class Tool:
    """How to find one program: an override variable, names on PATH, extra folders, an
    optional capability probe, and what to tell a user who does not have it."""

    name: str
    env_var: str
    programs: tuple[str, ...]
    install: str
    folders: Callable[[], Iterable[Path]] = lambda: ()
    usable: Callable[[str], bool] = lambda path: True
    what: str = ""  # how the error names it, when the program name alone says too little
    # for tools that compile for a GPU target: whether the program at a path targets `arch`
    targets: Callable[[str, str], bool] | None = None
    install_for: Callable[[str], str] = lambda arch: ""  # the install hint for one target
    skippable: bool = True  # `--skip NAME` (the static checks) may name it


_NV_TOOLS_INSTALL = "pip install 'nvidia-cuda-nvdisasm>=13.2,<14' 'nvidia-cuda-cuobjdump>=13.2,<14' (the nvtools extra)"
TOOLS: dict[str, Tool] = {
    "nvcc": Tool("nvcc", "HZ_NVCC", ("nvcc",), "install the CUDA toolkit (nvcc) or set HZ_NVCC",
                 folders=_cuda_homes),
    "hipcc": Tool("hipcc", "HZ_HIPCC", ("hipcc",), "install ROCm (hipcc) or set HZ_HIPCC",
                  folders=lambda: [Path("/opt/rocm/bin")]),
    "clang": Tool("clang", "HZ_CLANG", ("clang-19", "clang-22", "clang-21", "clang-20", "clang"),
                  "apt-get install clang-19, or set HZ_CLANG",
                  usable=_has_amdgpu_backend, what="clang-19 with the AMDGPU backend",
                  targets=_clang_targets,
                  install_for=lambda arch: ("apt-get install clang-22 (Debian 12: bookworm-security; "
                                            "scripts/setup.sh does it), or set HZ_CLANG to a clang that "
                                            "targets gfx950") if arch != GFX942 else ""),
    # The C preprocessor alone: `hazards mutate` maps its output back to source lines when
    # neither nvcc nor clang is installed.
    "cpp": Tool("cpp", "HZ_CPP", ("cpp",), "apt-get install cpp (or gcc), or set HZ_CPP"),
    # LLVM's assembler and disassembler, of the release of the clang they serve (`like=`):
    # the static checks' user builds make a missing ROCm device library with them.
    "llvm-as": Tool("llvm-as", "HZ_LLVM_AS", ("llvm-as",), "apt-get install llvm-19, or set HZ_LLVM_AS"),
    "llvm-dis": Tool("llvm-dis", "HZ_LLVM_DIS", ("llvm-dis",), "apt-get install llvm-19, or set HZ_LLVM_DIS"),
    # Runs a family's binary under its race/sync/memory checkers (`hazards stress --sanitizer`).
    "compute-sanitizer": Tool("compute-sanitizer", "HZ_COMPUTE_SANITIZER", ("compute-sanitizer",),
                              "install the CUDA toolkit (compute-sanitizer), or set HZ_COMPUTE_SANITIZER",
                              folders=_cuda_homes, skippable=False),
    "nvdisasm": Tool("nvdisasm", "HZ_NVDISASM", ("nvdisasm",), _NV_TOOLS_INSTALL,
                     folders=lambda: [*_cuda_homes(), *_nvidia_wheel_bins()]),
    "cuobjdump": Tool("cuobjdump", "HZ_CUOBJDUMP", ("cuobjdump",), _NV_TOOLS_INSTALL,
                      folders=lambda: [*_cuda_homes(), *_nvidia_wheel_bins()]),
}


# The tools `skipping` refuses, per context (a thread that runs the static part beside a
# check's family builds skips clang there, not in the builds; hazards.static.runner hands
# the context to its worker threads).
_SKIPPED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("hz_skipped_tools", default=frozenset())


@contextlib.contextmanager
def skipping(names: Iterable[str]) -> Iterator[None]:
    """Within (this context): `find_tool` refuses these tools (`ToolchainMissing` with
    `skipped=True`), installed or not, so what needs them is reported as skipped at the
    user's request."""
    unknown = sorted(set(names) - set(TOOLS))
    if unknown:
        raise UserError(f"unknown tool {unknown[0]!r} (known: {', '.join(TOOLS)})")
    token = _SKIPPED.set(_SKIPPED.get() | frozenset(names))
    try:
        yield
    finally:
        _SKIPPED.reset(token)


def find_tool(name: str, needed_for: str = "", *, arch: str | None = None, like: str | None = None) -> str:
    """Path of tool `name` (a key of TOOLS); ToolchainMissing (one line: the tool, what
    needed it, how to install it or skip what needs it) if it is not installed. `arch` (a
    tool that compiles for GPU targets: clang): the first candidate that compiles for that
    target, default gfx942. `like` (a clang's path): that release's program first
    (llvm-as-19 for clang-19, beside it or on PATH). Looked up again whenever the override
    variable, PATH or CUDA_HOME/CUDA_PATH change; capability probes run once (again when
    one of their tools was killed: `cache_unless_killed`)."""
    if name not in TOOLS:
        raise UserError(f"unknown tool {name!r} (known: {', '.join(TOOLS)})")
    tool = TOOLS[name]
    if tool.targets is not None:
        arch = arch or GFX942
        amd_arch_flag(arch)  # a malformed target is the user's error, not a missing tool
    else:
        arch = None
    what = tool.what or tool.name
    if arch and arch != GFX942:
        what = f"{tool.name} for {arch}"
    why = f" (needed {needed_for})" if needed_for else ""
    if name in _SKIPPED.get():
        raise ToolchainMissing(f"{what} skipped{why}: --skip {name}", tool=name, skipped=True)
    env = tuple(os.environ.get(k, "") for k in (tool.env_var, "PATH", "CUDA_HOME", "CUDA_PATH"))
    found, reason = _lookup(name, env, arch, like)
    if found is None:
        hint = (tool.install_for(arch) if arch else "") or tool.install
        skip = f" (or --skip {name} to skip what needs it)" if tool.skippable else ""
        raise ToolchainMissing(f"{what} not found{why}: {reason or hint}{skip}", tool=name)
    return found


@cache_unless_killed
def _lookup(name: str, env: tuple[str, ...], arch: str | None = None, like: str | None = None
            ) -> tuple[str | None, str]:
    """(path or None, reason). `env` is part of the cache key only."""
    tool = TOOLS[name]

    def fits(path: str) -> bool:
        return tool.usable(path) and (arch is None or tool.targets is None or tool.targets(path, arch))

    override = env[0]
    if override:
        path = shutil.which(override)
        if path is None:
            return None, f"{tool.env_var}={override} is not an executable"
        if not tool.usable(path):
            return None, f"{tool.env_var}={override} cannot do the job ({tool.install})"
        if not fits(path):
            return None, (f"{tool.env_var}={override} cannot compile for {arch} "
                          f"({tool.install_for(arch) or tool.install})")
        return path, ""
    release = Path(like).name.replace("clang", name, 1) if like and "clang" in Path(like).name else None
    candidates = [str(Path(like).with_name(release)), shutil.which(release)] if release else []
    candidates += [shutil.which(p) for p in tool.programs]
    candidates += [str(d / p) for d in tool.folders() for p in tool.programs]
    for cand in candidates:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK) and fits(cand):
            return cand, ""
    return None, ""


find_tool.cache_clear = _lookup.cache_clear  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=None)
def tool_version(path: str) -> str:
    """The lines of `path --version` that name the release ("Cuda compilation tools,
    release 13.0, V13.0.88", "Ubuntu clang version 19.1.1"): the same compiler installed
    on another machine (another "Built on" date or copyright line) then shares a cache key."""
    try:
        out = run_in_group([path, "--version"], 60, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainMissing(f"{path} --version failed: {exc}") from None
    if out.returncode < 0:  # killed (its phase ended): what it printed names no release
        raise ToolchainMissing(f"{path} --version failed: killed by signal {-out.returncode}")
    text = out.stdout.strip() or out.stderr.strip()
    keep = [ln for ln in text.splitlines() if re.search(r"release|version", ln, re.I)
            and not re.search(r"copyright|built on", ln, re.I)]
    return "\n".join(keep) or text


# ------------------------------------------------------------------------ cache keys --
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def included_files(main: Path, include_dirs: Sequence[Path] = ()) -> list[Path]:
    """`main` and every file it reaches through `#include "..."`, transitively, each name
    resolved as the compiler does: beside the including file, then in `include_dirs` (-I).
    System includes (<...>) are the compiler's business."""
    seen: set[Path] = set()
    todo = [Path(main).resolve()]
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        for name in _INCLUDE_RE.findall(f.read_text(errors="replace")):
            for folder in (f.parent, *include_dirs):
                if (Path(folder) / name).is_file():
                    todo.append((Path(folder) / name).resolve())
                    break
    return sorted(seen)


def source_files(dirs: Sequence[Path], main: Path | None = None) -> list[Path]:
    """Every source file under `dirs` plus what `main` includes (sorted: a stable hash)."""
    files: list[Path] = list(included_files(main)) if main else []
    for d in dirs:
        if d.is_dir():
            files += [p.resolve() for p in d.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES]
    return sorted(set(files))


# Flags whose output carries line tables (nvcc -lineinfo / -G, clang -g...): they name each
# source by where it was read (nvcc: the folder it ran in and the name it was given).
_LINE_TABLE_FLAG = re.compile(r"-lineinfo|--generate-line-info|-G|--device-debug|"
                              r"-g(?:\d|line-tables-only|line-directives-only|gdb\d?|dwarf(?:-\d)?)?")


def names_its_sources(args: Sequence[str]) -> bool:
    """Whether a build with these arguments outputs its sources' paths: line tables, or the
    line markers of preprocessed text (`-E` without `-P`). Such an output belongs to the
    checkout it was built from, so the static checks key it without a `root` (absolute
    paths): a second checkout of the same files at the same place gets its own build."""
    preprocessed = any(a in ("-E", "--preprocess") for a in args) and "-P" not in args
    return preprocessed or any(_LINE_TABLE_FLAG.fullmatch(a) for a in args)


def cache_key(files: Sequence[Path], args: Sequence[str], version: str, *, root: Path | None = None) -> str:
    """sha256 over every file (its path relative to `root`, when under it, and its bytes),
    the arguments (with `root` written as `<root>` in them, e.g. in `-I` flags) and the
    tool's version: the same sources installed elsewhere share one build. Without `root`,
    by absolute path (a build that `names_its_sources`)."""
    h = hashlib.sha256()
    root_dir = Path(root).resolve() if root is not None else None
    for f in files:
        name = Path(f).resolve()
        if root_dir is not None:
            try:
                name = name.relative_to(root_dir)
            except ValueError:
                pass
        h.update(str(name).encode() + b"\0" + Path(f).read_bytes() + b"\0")
    if root_dir is not None:
        args = [a.replace(str(root_dir), "<root>") for a in args]
    h.update("\0".join(args).encode() + b"\0" + version.encode())
    return h.hexdigest()


# -------------------------------------------------------------------- the build cache --
def cache_root() -> Path:
    """The per-user build cache: $HZ_BUILD_DIR, else $XDG_CACHE_HOME/gpu-hazards, else
    ~/.cache/gpu-hazards. Never the installed package, never the current folder."""
    override = os.environ.get("HZ_BUILD_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "gpu-hazards"


def cache_dir(kind: str) -> Path:
    """One kind of build's folder in the cache ("family", "static", "megakernel"), created."""
    d = cache_root() / kind
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the build cache {d}: {e.strerror} (set HZ_BUILD_DIR)") from None
    return d


def cached_output(out: Path, produce: Callable[[Path], None]) -> Path:
    """`out`, produced first if it is not in the cache yet: `produce(tmp)` writes `tmp` (a
    name beside `out`), which then replaces `out` atomically; a reader never sees half a
    file. Concurrent producers of one `out` wait on a lock and share one run. If `produce`
    raises, nothing is cached. `out` may be a file or a folder; what a killed producer left
    half made is removed by the next one, never taken for `out`."""
    out = Path(out)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if out.exists():  # another process produced it while we waited
            return out
        # every producer of `out` holds this lock: a tmp of it there now is a killed one's
        # (its pid may be ours again: pids repeat in containers). One whose pid lives here
        # goes only once older than any produce: on a shared file system whose locks another
        # host does not see, it may be that host's producer at work.
        tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp{out.suffix}")
        mine = re.compile(rf"\.{re.escape(out.stem)}\.(\d+)\.tmp{re.escape(out.suffix)}")
        for p in list(out.parent.iterdir()):
            m = mine.fullmatch(p.name)
            if m and (p == tmp or not psutil.pid_exists(int(m.group(1))) or _age_s(p) > 2 * COMPILE_TIMEOUT_S):
                _remove_path(p)
        try:
            produce(tmp)
            os.replace(tmp, out)
        finally:
            _remove_path(tmp)
    return out


def _age_s(path: Path) -> float:
    """Seconds since `path` was last modified (0 if it is gone)."""
    try:
        return time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return 0.0


def _remove_path(path: Path) -> None:
    """Remove a file or a folder tree, if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
