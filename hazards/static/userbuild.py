"""The user's build: compile_commands.json entries, the flags kept from them, the preprocessor.

The preprocessor runs with those flags to expand the source lint's macro templates. A compile
command names a compiler (nvcc, hipcc, clang, ...), flags, the source and an output. For the
static checks only what decides the *text* the compiler sees is kept: include paths, defines,
the language standard, forced includes (and nvcc's `--expt-*` switches for an nvcc build);
outputs, targets, optimisation and dependency flags are ours to choose. Relative paths stay
relative: commands run in the entry's `directory`, as the build did.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from hazards.engine import toolchain
from hazards.engine.errors import ToolchainMissing, UserError
from hazards.engine.proctree import cache_unless_killed, run_in_group
from hazards.static.asm_lint import ExpandError

# flag -> whether it takes the next argument when written alone (`-I dir`)
_KEEP_WITH_VALUE = ("-I", "-isystem", "-iquote", "-idirafter", "-D", "-U", "-include",
                    "-imacros", "--include-path", "--define-macro", "--undefine-macro",
                    "--pre-include", "--system-include")
_KEEP_ALONE = re.compile(r"^(-std=|--std=|-fms-extensions|-fno-exceptions|-fno-rtti|"
                         r"-fdeclspec|--expt-relaxed-constexpr|--expt-extended-lambda|"
                         r"--extended-lambda|-DNDEBUG)")
_NVCC_LONG = {"--include-path": "-I", "--define-macro": "-D", "--undefine-macro": "-U",
              "--pre-include": "-include", "--system-include": "-isystem"}
_NVCC_ONLY = ("--expt-relaxed-constexpr", "--expt-extended-lambda", "--extended-lambda")
# clang says `'x.h' file not found`; gcc (cpp, and nvcc, which preprocesses with it) `x.h: No such file`.
_MISSING_HEADER = re.compile(r"fatal error: (?:'([^']+)' file not found|([^:\s]+): No such file or directory)")
MAX_STUBS = 32


def source_flags(args: Sequence[str], *, for_nvcc: bool = False) -> list[str]:
    """The flags of a command line that decide the text the compiler sees (see module doc);
    `for_nvcc` keeps nvcc's own switches, which clang does not accept."""
    out: list[str] = []
    it = iter(range(len(args)))
    for k in it:
        a = args[k]
        name = next((f for f in _KEEP_WITH_VALUE if a.startswith(f)), None)
        if name is not None:
            if a == name:
                value = args[k + 1] if k + 1 < len(args) else ""
                next(it, None)
            else:
                value = a[len(name):].lstrip("=")
            flag = _NVCC_LONG.get(name, name)
            out += [flag + value] if len(flag) == 2 else [flag, value]
        elif _KEEP_ALONE.match(a) and (for_nvcc or a not in _NVCC_ONLY):
            out.append("-std=" + a.split("=", 1)[1] if a.startswith("--std=") else a)
    return out


@dataclasses.dataclass(frozen=True)
class Entry:
    """One compile command: where it ran, the source, and its arguments (compiler first)."""

    directory: Path
    file: Path
    arguments: tuple[str, ...]

    @property
    def compiler(self) -> str:
        return Path(self.arguments[0]).name if self.arguments else ""

    @property
    def platform(self) -> str:
        """'nvidia' for nvcc / CUDA builds, 'amd' for hipcc / clang HIP builds."""
        args = " ".join(self.arguments)
        if "nvcc" in self.compiler or re.search(r"-x\s*cuda\b|--cuda-gpu-arch", args):
            return "nvidia"
        if ("hipcc" in self.compiler or "amdclang" in self.compiler
                or re.search(r"--offload-arch|-x\s*hip\b|--amdgpu-target", args)):
            return "amd"
        return "nvidia" if self.file.suffix in (".cu", ".cuh") else "amd"


class CompileDatabase:
    """A compile_commands.json: entries by source file."""

    def __init__(self, path: Path, entries: Iterable[Entry]) -> None:
        self.path = Path(path)
        self.entries = list(entries)
        self._by_file = {e.file: e for e in self.entries}

    @classmethod
    def load(cls, path: Path) -> "CompileDatabase":
        """Read a compile_commands.json (a UserError on anything malformed)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"no such compile database: {path}") from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read compile database {path}: {e}") from None
        if not isinstance(data, list):
            raise UserError(f"{path}: a compile database is a JSON array of commands")
        entries = []
        for k, raw in enumerate(data):
            if not isinstance(raw, dict) or "file" not in raw or "directory" not in raw:
                raise UserError(f"{path}: entry #{k} needs `directory` and `file`")
            args = raw.get("arguments")
            if args is None:
                try:
                    args = shlex.split(raw.get("command", ""))
                except ValueError as e:
                    raise UserError(f"{path}: entry #{k}: cannot split its command ({e})") from None
            directory = Path(raw["directory"])
            file = Path(raw["file"])
            file = (file if file.is_absolute() else directory / file).resolve()
            entries.append(Entry(directory, file, tuple(str(a) for a in args)))
        return cls(path, entries)

    @classmethod
    def find(cls, start: Path) -> "CompileDatabase | None":
        """The nearest compile_commands.json at or above `start` (also in a `build/` there)."""
        start = Path(start).resolve()
        for d in [start, *start.parents] if start.is_dir() else start.parents:
            for cand in (d / "compile_commands.json", d / "build" / "compile_commands.json"):
                if cand.is_file():
                    return _load_cached(cand)
        return None

    def entry_for(self, source: Path) -> Entry | None:
        """The command that compiles `source`; for a file the build never compiles (a
        header), the command of a source in its folder or the nearest one above it."""
        source = Path(source).resolve()
        if source in self._by_file:
            return self._by_file[source]
        for d in source.parents:
            near = [e for e in self.entries if d in e.file.parents]
            if near:
                return min(near, key=lambda e: (len(e.file.parents), str(e.file)))
        return None


@functools.lru_cache(maxsize=16)
def _load_cached(path: Path) -> CompileDatabase:
    return CompileDatabase.load(path)


def _compiles(clang: str, args: Sequence[str], source: str) -> bool:
    try:
        proc = run_in_group([clang, *args, "-", "-o", "-"], 120, input=source, text=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def rocm_path() -> str | None:
    """The user's ROCm installation: `$ROCM_PATH` (`--rocm-path` sets it), else None (the
    system's HIP headers and device libraries, Debian's). A value that is not a folder is
    a UserError."""
    value = os.environ.get("ROCM_PATH", "")
    if not value:
        return None
    if not Path(value).is_dir():
        raise UserError(f"ROCM_PATH={value} is not a folder (a ROCm installation, e.g. /opt/rocm)")
    return str(Path(value).resolve())


def _rocm_args() -> tuple[str, ...]:
    rocm = rocm_path()
    return (f"--rocm-path={rocm}",) if rocm else ()


def hip_headers_found(clang: str) -> bool:
    """Whether `clang -x hip` finds ROCm's HIP headers (`<hip/hip_runtime.h>`): in the
    user's ROCm (`rocm_path`) when one is given, else by itself."""
    return _hip_headers_found(clang, _rocm_args())


@cache_unless_killed
def _hip_headers_found(clang: str, rocm: tuple[str, ...]) -> bool:
    return _compiles(clang, ["-E", "-x", "hip", "--cuda-device-only", toolchain.amd_arch_flag(toolchain.GFX942),
                             "-nogpulib", *rocm], "#include <hip/hip_runtime.h>\n")


_BITCODE_DIRS = ("/opt/rocm/amdgcn/bitcode", "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "/usr/lib/amdgcn/bitcode")
_KERNEL = "__attribute__((global)) void hz_probe(int* p) { __builtin_amdgcn_s_barrier(); }\n"


def isa_version(arch: str) -> int:
    """The number ROCm's device libraries give a target: gfx942 -> 9402, gfx90a -> 9010."""
    digits = arch.removeprefix("gfx")
    return int(digits[:-2]) * 1000 + int(digits[-2], 16) * 100 + int(digits[-1], 16)


def device_lib_args(clang: str, arch: str = toolchain.GFX942) -> tuple[str, ...]:
    """clang's flags to link ROCm's device libraries for `arch`, so that `__syncthreads`,
    `__threadfence` and friends compile to the fences and barriers they are (without the
    libraries they stay calls the checks cannot see through). With the user's ROCm
    (`rocm_path`): `--rocm-path=` it, its headers and libraries as they are; else the
    system's (`_system_device_lib_args`)."""
    return _rocm_args() or _system_device_lib_args(clang, arch)


@cache_unless_killed
def _system_device_lib_args(clang: str, arch: str = toolchain.GFX942) -> tuple[str, ...]:
    """The system's device libraries for `arch` (no `ROCM_PATH`).

    Where the installed libraries predate the target (Debian's ROCm 5.2 has no
    `oclc_isa_version_942.bc`), a folder in the build cache links to them and adds that
    one-constant library, written from the target's ISA number. Without any libraries:
    `-nogpulib` (and `device_libs_missing` says so)."""
    base = ["-x", "hip", "--cuda-device-only", toolchain.amd_arch_flag(arch), "-nogpuinc", "-S"]
    if _compiles(clang, base, _KERNEL):
        return ()
    src = next((Path(d) for d in _BITCODE_DIRS if (Path(d) / "ockl.bc").is_file()), None)
    if src is None:
        return ("-nogpulib",)
    dest = toolchain.cache_dir("static") / "rocm-device-libs" / arch
    dest.mkdir(parents=True, exist_ok=True)
    for lib in src.glob("*.bc"):
        with contextlib.suppress(FileExistsError):  # another process (an xdist worker) made it first
            (dest / lib.name).symlink_to(lib)
    isa = dest / f"oclc_isa_version_{arch.removeprefix('gfx')}.bc"
    if not isa.exists() and not _write_isa_library(clang, src, isa, isa_version(arch)):
        return ("-nogpulib",)
    flag = f"--rocm-device-lib-path={dest}"
    # A clang newer than the libraries asks for their ABI-version library of its default code
    # object (clang-22: v6, "requires ROCm 6.3"); Debian's ROCm 5.2 has v4 and v5: build v5.
    for args in ((flag,), (flag, "-mcode-object-version=5")):
        if _compiles(clang, [*base, *args], _KERNEL):
            return (*args, *_hip_library_args(clang, [*base, *args], dest))
    return ("-nogpulib",)


def _hip_library_args(clang: str, args: Sequence[str], libs: Path) -> tuple[str, ...]:
    """Link the libraries' `hip.bc` where this clang no longer does by itself (clang 22):
    HIP 5.2's `__syncthreads()` calls its `__atomic_work_item_fence`, which left unlinked
    stays a call (`s_swappc_b64`) that hides the barrier's fences from the checks."""
    hip = libs / "hip.bc"
    if not hip.is_file():
        return ()
    try:
        proc = run_in_group([clang, *args, "-###", "-", "-o", "-"], 60, input=_KERNEL, text=True)
    except (OSError, subprocess.SubprocessError):
        return ()
    if "hip.bc" in proc.stderr:
        return ()
    return ("-Xclang", "-mlink-builtin-bitcode", "-Xclang", str(hip))


def _write_isa_library(clang: str, src: Path, out: Path, version: int) -> bool:
    """Assemble the one-constant `oclc_isa_version` library with llvm-as (next to clang),
    in the data layout of the installed ones."""
    try:
        llvm_as = toolchain.find_tool("llvm-as", "to build a ROCm device library", like=clang)
        llvm_dis = toolchain.find_tool("llvm-dis", "to build a ROCm device library", like=clang)
    except ToolchainMissing:  # then the build links no device library (-nogpulib), as before
        return False
    sample = next(iter(sorted(src.glob("oclc_isa_version_9*.bc"))), None)
    if sample is None:
        return False
    dis = run_in_group([llvm_dis, str(sample), "-o", "-"], 60, text=True)
    layout = next((ln for ln in dis.stdout.splitlines() if ln.startswith("target datalayout")), "")
    ir = (f"{layout}\ntarget triple = \"amdgcn-amd-amdhsa\"\n"
          f"@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) "
          f"constant i32 {version}, align 4\n")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # per process: replace() is the atomic step
    proc = run_in_group([llvm_as, "-", "-o", str(tmp)], 60, input=ir, text=True)
    if proc.returncode != 0:
        return False
    tmp.replace(out)
    return True


@cache_unless_killed
def wavefront_size_args(clang: str, arch: str = toolchain.GFX942) -> tuple[str, ...]:
    """`-D__AMDGCN_WAVEFRONT_SIZE=N` where `clang` no longer defines it (clang 22 dropped
    the macro) for headers that still read it (HIP 5.2's `warpSize`); else nothing. N is the
    target's default wave size: 64 on gfx9 (CDNA), 32 from gfx10 on."""
    try:
        proc = run_in_group([clang, *toolchain.AMD_DEVICE_ONLY_FLAGS, toolchain.amd_arch_flag(arch),
                             "-dM", "-E", "-", "-o", "-"], 60, input="", text=True)
    except (OSError, subprocess.SubprocessError):
        return ()
    if proc.returncode != 0 or "__AMDGCN_WAVEFRONT_SIZE " in proc.stdout:
        return ()
    return (f"-D__AMDGCN_WAVEFRONT_SIZE={64 if re.fullmatch(r'gfx9[0-9a-f]{2}', arch) else 32}",)


_HIP_COMPAT = Path(__file__).with_name("hip_compat")


@cache_unless_killed
def header_compat_args(clang: str) -> tuple[str, ...]:
    """`-include` of the project's own declarations that the installed HIP headers take from
    clang's HIP runtime wrapper where this clang's wrapper no longer has them (clang 22 and
    HIP 5.2: `__llvm_amdgcn_rcp_f16`); else nothing."""
    try:
        resource = run_in_group([clang, "-print-resource-dir"], 60, text=True).stdout.strip()
        declares = (Path(resource) / "include" / "__clang_hip_libdevice_declares.h").read_text(errors="replace")
    except (OSError, subprocess.SubprocessError):
        return ()
    if "__llvm_amdgcn_rcp_f16" in declares:
        return ()
    return ("-include", str(_HIP_COMPAT / "hip52_rcp_f16.h"))


HIP6_COMPAT_ENV = "HZ_HIP6_COMPAT"  # set (by `--hip6-compat`): HIP builds get `hip6_compat_args`


def wheel_include_dirs() -> list[Path]:
    """Header folders that installed Python wheels carry, found without importing them:
    triton's AMD backend (`triton/backends/amd/include`: HIP 7's runtime headers and ROCm's
    thunk types `hsakmt/`) and PyTorch's (`torch/include`: `c10/...`). Missing wheels give
    nothing."""
    import importlib.util

    out = []
    for package, sub in (("triton", "backends/amd/include"), ("torch", "include")):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            if (Path(root) / sub).is_dir():
                out.append(Path(root) / sub)
                break
    return out


def hip6_compat_args() -> list[str]:
    """Flags to compile a source written for ROCm 6 with an older HIP (Debian's 5.2): the
    project's own declarations (`hip_compat/hip6_names.h` force-included, `hip_compat/rocm6`
    before the system headers: stand-ins for `hip/hip_bf16.h` and `hip/hip_fp8.h`), then the
    headers installed wheels carry (`wheel_include_dirs`) *after* the system's, so that they
    only supply what the system lacks (ROCm's `hsakmt/` types, PyTorch's `c10/`) and never
    mix a second HIP version into the system's. An approximation of a ROCm 6 build: see
    hip_compat/rocm6/hip/hip_bf16.h."""
    return ["-include", str(_HIP_COMPAT / "hip6_names.h"), f"-I{_HIP_COMPAT / 'rocm6'}",
            *(f"-idirafter{d}" for d in wheel_include_dirs())]


def hip_device_args(clang: str, arch: str = toolchain.GFX942) -> list[str]:
    """clang's flags for the device side of a HIP source: the installed HIP headers when
    clang finds them (otherwise `-nogpuinc`: the source must bring its own; with them, the
    wave-size macro and the declarations they expect from an older clang, where this clang
    no longer has them, and with `$HZ_HIP6_COMPAT` set - `--hip6-compat` - the ROCm 6
    stand-ins of `hip6_compat_args`) and the device libraries (`device_lib_args`)."""
    args = ["-x", "hip", "--cuda-device-only", toolchain.amd_arch_flag(arch), *device_lib_args(clang, arch)]
    if not hip_headers_found(clang):  # (with the user's ROCm, device_lib_args gave --rocm-path)
        return [*args, "-nogpuinc"]
    compat = hip6_compat_args() if os.environ.get(HIP6_COMPAT_ENV) else []
    return [*args, *wavefront_size_args(clang, arch), *header_compat_args(clang), *compat]


class Preprocessor:
    """`clang -E` over a user's source with the flags its build uses, for the source lint
    (an `asm_lint.Expander`). Flags: the file's compile_commands.json entry (an explicit
    database, or the nearest one found above the file), then `extra` (-I/-D/-U/-include
    from the command line). Headers that cannot be found are replaced by empty stubs in a
    temporary folder (the macros the file defines itself still expand); `stubbed` records
    which, per file."""

    def __init__(self, extra: Sequence[str] = (), database: CompileDatabase | None = None,
                 discover: bool = True, clang: str | None = None) -> None:
        self.extra = list(extra)
        self.database = database
        self.discover = discover
        self._clang = clang
        self.stubbed: dict[str, list[str]] = {}

    def flags_for(self, source: Path) -> tuple[list[str], Path]:
        """(flags, working directory) for preprocessing `source`."""
        db = self.database or (CompileDatabase.find(source) if self.discover else None)
        entry = db.entry_for(source) if db is not None else None
        if entry is None:
            return [f"-I{Path(source).resolve().parent}", *self.extra], Path(source).resolve().parent
        return [*source_flags(entry.arguments[1:]), f"-I{Path(source).resolve().parent}",
                *self.extra], entry.directory

    def __call__(self, source: Path) -> str:
        """The preprocessed text of `source` with line markers (ExpandError on failure;
        ToolchainMissing without clang-19: the lint could not look, which is not a pass)."""
        clang = self._clang or _find_clang()
        flags, cwd = self.flags_for(source)
        with tempfile.TemporaryDirectory(prefix="hz-stubs-") as stubs:
            stubbed: list[str] = []
            out = preprocess_with_stubs([clang, "-E", *hip_device_args(clang), "-w", *flags], Path(source).resolve(),
                                        Path(stubs), stubbed, cwd=cwd if cwd.is_dir() else None)
        if stubbed:
            self.stubbed[str(source)] = stubbed
        return out


def preprocess_with_stubs(argv: Sequence[str], source: Path, stubs: Path, stubbed: list[str], *,
                          cwd: Path | None = None, timeout_s: float = 120.0) -> str:
    """stdout of the preprocessor command `argv` over `source` (clang, gcc's cpp or nvcc with
    `-E`). A header it cannot find becomes an empty stub under the folder `stubs` (searched
    from four folders down, so that `"../x.h"` lands inside it too) and is appended to
    `stubbed`; ExpandError with the first error line otherwise."""
    search = stubs.joinpath("d", "d", "d", "d")
    search.mkdir(parents=True, exist_ok=True)
    name = ""
    for _ in range(MAX_STUBS + 1):
        try:  # its own process group: nvcc -E runs gcc under it, and a timeout must end both
            proc = run_in_group([*argv, f"-I{search}", str(source)], timeout_s, text=True, errors="surrogateescape",
                                cwd=cwd)
        except subprocess.TimeoutExpired:
            raise ExpandError(f"{Path(argv[0]).name} -E timed out after {timeout_s:g} s") from None
        except OSError as e:
            raise ExpandError(f"cannot run {argv[0]}: {e}") from None
        if proc.returncode == 0:
            return proc.stdout
        m = _MISSING_HEADER.search(proc.stderr)
        name = (m.group(1) or m.group(2)) if m else ""
        stub = (search / name).resolve() if name else None
        if stub is None or not stub.is_relative_to(stubs.resolve()) or name in stubbed or len(stubbed) >= MAX_STUBS:
            last = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
            raise ExpandError(" ".join(last.split())[:300] or f"{Path(argv[0]).name} exit {proc.returncode}")
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("")
        stubbed.append(name)
    raise ExpandError("too many missing headers")


def _find_clang() -> str:
    return toolchain.find_tool("clang", needed_for="to expand macro templates for the source lint")


def preprocessor_for(flags: Sequence[str] = (), compile_commands: Path | None = None) -> Preprocessor:
    """The lint's macro expander for a command line: `flags` (-I/-D) on top of the given
    compile database, or of the nearest compile_commands.json above each source."""
    db = CompileDatabase.load(compile_commands) if compile_commands is not None else None
    return Preprocessor(extra=flags, database=db, discover=db is None)
