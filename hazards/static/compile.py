"""Compiler and disassembler invocation for the static checks, with a content-keyed cache.

The checks read what the compiler really emitted: AMDGCN assembly from clang-19
(`-x hip --offload-arch=gfx942 -nogpulib -nogpuinc --cuda-device-only -O3 -S`), cubins from
nvcc, SASS from nvdisasm/cuobjdump (pip wheels `nvidia-cuda-nvdisasm`,
`nvidia-cuda-cuobjdump`, found on PATH or inside the installed `nvidia` package).
A tool that is not installed raises `ToolchainMissing` naming what to install.

Builds are cached under ``build/static/`` (override: ``HZ_STATIC_BUILD_DIR``) keyed by the
compiler, its arguments and the text of the source and of every file it includes with
quotes, so a rerun of the tests or of `hazards static` compiles nothing twice; the listing
stays on disk, so findings point at a file a human can open.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

from hazards.engine.errors import ToolchainMissing, UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
AMD_FLAGS = ("-x", "hip", "-nogpulib", "-nogpuinc", "--cuda-device-only", "-O3", "-S")
# Every family source compiled for the static checks sees this define: it selects the
# two-line attribute shim instead of <hip/hip_runtime.h>, which -nogpuinc leaves out.
STATIC_DEFINE = "HZ_STATIC_ONLY"
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def build_dir() -> Path:
    """Where compiled listings are kept (created on demand)."""
    d = Path(os.environ.get("HZ_STATIC_BUILD_DIR", REPO_ROOT / "build" / "static"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@functools.lru_cache(maxsize=None)
def find_clang() -> str:
    """Path of a clang with the AMDGPU backend (HZ_CLANG, clang-19, or clang)."""
    for cand in (os.environ.get("HZ_CLANG"), "clang-19", "clang"):
        if not cand:
            continue
        path = shutil.which(cand)
        if path and _clang_has_amdgpu(path):
            return path
    raise ToolchainMissing(
        "clang-19 with the AMDGPU backend is not installed (apt-get install clang-19, "
        "or set HZ_CLANG); the AMDGCN static checks need it")


def _clang_has_amdgpu(path: str) -> bool:
    try:
        out = subprocess.run([path, "-print-targets"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "amdgcn" in out


@functools.lru_cache(maxsize=None)
def find_nvcc() -> str:
    """Path of nvcc (HZ_NVCC, PATH, /usr/local/cuda/bin)."""
    for cand in (os.environ.get("HZ_NVCC"), "nvcc", "/usr/local/cuda/bin/nvcc"):
        if cand and shutil.which(cand):
            return shutil.which(cand)  # type: ignore[return-value]
    raise ToolchainMissing("nvcc is not installed (CUDA toolkit); the NVIDIA static checks need it")


@functools.lru_cache(maxsize=None)
def find_nv_tool(name: str) -> str:
    """Path of `nvdisasm` or `cuobjdump`: PATH first, then the pip wheels' `nvidia/*/bin`."""
    path = shutil.which(name)
    if path:
        return path
    try:
        import nvidia  # namespace package installed by the nvidia-cuda-* wheels

        for root in nvidia.__path__:
            for cand in sorted(Path(root).glob(f"*/bin/{name}")):
                if os.access(cand, os.X_OK):
                    return str(cand)
    except ImportError:
        pass
    raise ToolchainMissing(
        f"{name} is not installed; pip install 'nvidia-cuda-nvdisasm>=13.2,<14' "
        "'nvidia-cuda-cuobjdump>=13.2,<14' (the `nvtools` extra) for the SASS checks")


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


def _dependency_text(source: Path, text: str, seen: set[Path] | None = None) -> str:
    """The text of every quoted include reachable from `source` (for the cache key)."""
    seen = seen if seen is not None else set()
    parts = []
    for inc in _INCLUDE_RE.findall(text):
        p = (source.parent / inc).resolve()
        if p in seen or not p.is_file():
            continue
        seen.add(p)
        sub = p.read_text(errors="replace")
        parts.append(sub + _dependency_text(p, sub, seen))
    return "".join(parts)


def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        raise UserError(f"{what} timed out after 300 s: {' '.join(cmd)}") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise UserError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc


def _cached_build(tool: str, args: list[str], source: Path, text: str, suffix: str,
                  label: str, out_flag: str = "-o") -> Build:
    """Run `tool args source -o out` unless the same build is already cached."""
    key_src = "\0".join([tool, *args, text, _dependency_text(source, text)])
    digest = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    out = build_dir() / f"{label}-{digest}{suffix}"
    log_path = out.with_suffix(out.suffix + ".log")
    cmd = (tool, *args, str(source), out_flag, str(out))
    if not out.exists():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        proc = _run([tool, *args, str(source), out_flag, str(tmp)], label)
        log_path.write_text(proc.stderr)
        os.replace(tmp, out)
    log = log_path.read_text() if log_path.exists() else ""
    body = out.read_text(errors="replace") if suffix in (".s", ".ptx", ".i") else ""
    return Build(out, body, log, cmd)


def _with_text(source: Path, text: str | None) -> tuple[Path, str]:
    """The file to hand the compiler: `source` itself, or a copy holding `text` next to it."""
    if text is None:
        return source, source.read_text(errors="replace")
    tmpdir = build_dir() / "src"
    tmpdir.mkdir(exist_ok=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    copy = tmpdir / f"{source.stem}-{digest}{source.suffix}"
    if not copy.exists():
        fd, tmp = tempfile.mkstemp(dir=tmpdir, suffix=source.suffix)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, copy)
    return copy, text


def compile_amdgcn(source: Path, *, arch: str = "gfx942",
                   defines: Mapping[str, object] | None = None, text: str | None = None,
                   label: str | None = None, extra_args: tuple[str, ...] = ()) -> Build:
    """AMDGCN assembly for `source` (or for `text` in place of its contents).

    `HZ_STATIC_ONLY` is always defined; quoted includes resolve next to `source`.
    """
    clang = find_clang()
    src, body = _with_text(Path(source), text)
    args = [*AMD_FLAGS, f"--offload-arch={arch}", f"-D{STATIC_DEFINE}",
            f"-I{Path(source).resolve().parent}", *_define_args(defines), *extra_args]
    return _cached_build(clang, args, src, body, ".s", label or f"{Path(source).stem}-{arch}")


def preprocess(source: Path, *, defines: Mapping[str, object] | None = None,
               label: str | None = None) -> Build:
    """The preprocessed text of `source` (line markers kept, so lines map back)."""
    clang = find_clang()
    args = ["-E", "-x", "c++", f"-D{STATIC_DEFINE}", *_define_args(defines)]
    src = Path(source)
    return _cached_build(clang, args, src, src.read_text(errors="replace"), ".i",
                         label or f"{src.stem}-pp")


def compile_cubin(source: Path, *, arch: str = "sm_90a",
                  defines: Mapping[str, object] | None = None, label: str | None = None,
                  extra_args: tuple[str, ...] = ()) -> Build:
    """A cubin for `source` built with `nvcc -cubin -arch=<arch> -O3`; `log` is ptxas' stderr."""
    nvcc = find_nvcc()
    src = Path(source)
    args = ["-cubin", f"-arch={arch}", "-O3", *_define_args(defines), *extra_args]
    return _cached_build(nvcc, args, src, src.read_text(errors="replace"), ".cubin",
                         label or f"{src.stem}-{arch}")


def compile_ptx(source: Path, *, arch: str = "sm_90a",
                defines: Mapping[str, object] | None = None, label: str | None = None) -> Build:
    """The PTX nvcc emits for `source`."""
    nvcc = find_nvcc()
    src = Path(source)
    args = ["-ptx", f"-arch={arch}", "-O3", *_define_args(defines)]
    return _cached_build(nvcc, args, src, src.read_text(errors="replace"), ".ptx",
                         label or f"{src.stem}-{arch}")


def disassemble(cubin: Path) -> Build:
    """SASS text of a cubin (nvdisasm -c; cuobjdump -sass when nvdisasm is absent)."""
    try:
        tool, args = find_nv_tool("nvdisasm"), ["-c"]
    except ToolchainMissing:
        tool, args = find_nv_tool("cuobjdump"), ["-sass"]
    listing = cubin.with_suffix(".sass")
    cmd = (tool, *args, str(cubin))
    if not listing.exists() or listing.stat().st_mtime < cubin.stat().st_mtime:
        proc = _run(list(cmd), Path(tool).name)
        tmp = listing.with_name(listing.name + f".tmp{os.getpid()}")
        tmp.write_text(proc.stdout)
        os.replace(tmp, listing)
    return Build(listing, listing.read_text(errors="replace"), "", cmd)
