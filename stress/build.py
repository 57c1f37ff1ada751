"""Build a family's standalone binary for a GPU target, with a content-addressed cache.

A family's kernel folder (`standalone/<family>/`) holds one `<binary>.cu` that includes the
harness (`standalone/common/`) and maybe shared headers (`standalone/include/`). `build()`
compiles it with nvcc for `sm_90a` (or hipcc for `gfx942` where ROCm is installed) and
caches the binary under `.hazards/build/` keyed by a hash of every source file in those
folders, the compile flags, the compile-time defines and the compiler's `--version` text:
an unchanged tree never recompiles, and a new compiler or flag always does.

A missing compiler raises `ToolchainMissing` (one clear line); a compile error raises
`BuildFailed` with the first error line and the path of the full log. This module knows
nothing about families (`stress` never imports `hazards`): callers pass paths.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from filelock import FileLock

from hazards.engine.errors import ToolchainMissing, UserError

DEFAULT_CACHE = Path(".hazards") / "build"
COMPILE_TIMEOUT_S = 900.0
_SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".c", ".cc", ".cpp", ".inc")


class BuildFailed(UserError):
    """The compiler ran and rejected the sources."""


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """How to compile for one GPU architecture."""

    name: str
    compiler: str          # program looked up on PATH (or via the env var below)
    env_var: str           # e.g. HZ_NVCC=/opt/cuda/bin/nvcc overrides the lookup
    flags: tuple[str, ...]
    install_hint: str


TARGETS: dict[str, GpuTarget] = {
    "sm_90a": GpuTarget(
        "sm_90a", "nvcc", "HZ_NVCC",
        ("-O3", "-std=c++17", "-lineinfo", "-gencode=arch=compute_90a,code=sm_90a"),
        "install the CUDA toolkit (nvcc) or set HZ_NVCC"),
    "gfx942": GpuTarget(
        "gfx942", "hipcc", "HZ_HIPCC",
        ("-O3", "-std=c++17", "--offload-arch=gfx942"),
        "install ROCm (hipcc) or set HZ_HIPCC"),
}


def _known_target(target: str) -> GpuTarget:
    if target not in TARGETS:
        raise UserError(f"unknown build target {target!r} (known: {', '.join(TARGETS)})")
    return TARGETS[target]


def find_compiler(target: str) -> str:
    """Path of the compiler for `target`; ToolchainMissing (one line) if there is none."""
    t = _known_target(target)
    override = os.environ.get(t.env_var)
    if override:
        if shutil.which(override) is None:
            raise ToolchainMissing(f"{t.env_var}={override} is not an executable")
        return shutil.which(override)  # type: ignore[return-value]
    found = shutil.which(t.compiler)
    if found is None and t.compiler == "nvcc":
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if home and os.access(Path(home) / "bin" / "nvcc", os.X_OK):
                found = str(Path(home) / "bin" / "nvcc")
                break
    if found is None and t.compiler == "hipcc" and os.access("/opt/rocm/bin/hipcc", os.X_OK):
        found = "/opt/rocm/bin/hipcc"
    if found is None:
        raise ToolchainMissing(f"{t.compiler} not found: cannot build for {target} ({t.install_hint})")
    return found


_VERSION_CACHE: dict[str, str] = {}


def compiler_version(compiler: str) -> str:
    """The compiler's `--version` text (part of the cache key)."""
    if compiler not in _VERSION_CACHE:
        try:
            out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolchainMissing(f"{compiler} --version failed: {exc}") from None
        text = out.stdout.strip() or out.stderr.strip()
        # Keep the lines that name the release ("Cuda compilation tools, release 13.0,
        # V13.0.88", "HIP version: ..."): the same compiler installed on another machine
        # (a different "Built on" date or copyright line) then shares the cache.
        keep = [ln for ln in text.splitlines() if re.search(r"release|version", ln, re.I)
                and not re.search(r"copyright|built on", ln, re.I)]
        _VERSION_CACHE[compiler] = "\n".join(keep) or text
    return _VERSION_CACHE[compiler]


_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def included_files(main: Path) -> list[Path]:
    """`main` and every file it reaches through `#include "..."` (resolved relative to the
    including file), transitively. System includes (<...>) are the compiler's business."""
    seen: set[Path] = set()
    todo = [main.resolve()]
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        for name in _INCLUDE_RE.findall(f.read_text(errors="replace")):
            todo.append((f.parent / name).resolve())
    return sorted(seen)


def source_files(dirs: Sequence[Path], main: Path | None = None) -> list[Path]:
    """Every source file under `dirs` plus what `main` includes (sorted: a stable hash)."""
    files: list[Path] = list(included_files(main)) if main else []
    for d in dirs:
        if d.is_dir():
            files += [p.resolve() for p in d.rglob("*") if p.is_file() and p.suffix in _SOURCE_SUFFIXES]
    return sorted(set(files))


def cache_key(files: Sequence[Path], root: Path, flags: Sequence[str], version: str) -> str:
    """sha256 over (relative path, content) of every file, the flags and the compiler version."""
    h = hashlib.sha256()
    for f in files:
        try:
            rel = f.resolve().relative_to(root.resolve())
        except ValueError:
            rel = f.resolve()
        h.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
    h.update("\0".join(flags).encode() + b"\0" + version.encode())
    return h.hexdigest()


def define_flags(defines: Mapping[str, Any] | None) -> list[str]:
    """-DNAME=VALUE flags (True -> -DNAME=1, False -> -DNAME=0), sorted by name."""
    out = []
    for name, value in sorted((defines or {}).items()):
        if not name.isidentifier():
            raise UserError(f"bad define name {name!r}")
        if isinstance(value, bool):
            value = int(value)
        out.append(f"-D{name}={value}")
    return out


def build(source_dir: Path, binary: str, *, target: str = "sm_90a",
          defines: Mapping[str, Any] | None = None, shared_dirs: Sequence[Path] = (),
          cache_dir: Path | None = None, extra_flags: Sequence[str] = (),
          generated: Mapping[str, str] | None = None) -> Path:
    """Compile `source_dir/<binary>.cu` for `target`; return the cached executable's path.

    `generated` maps header names to their text (e.g. a family's `hz_family_table.h`):
    they are written beside the build and found through `-I`. The key covers every file in
    `source_dir` and `shared_dirs`, every file reached by `#include "..."` from the main
    source and the generated headers. Concurrent callers building the same key wait on a
    file lock and share one compile.
    """
    source_dir = Path(source_dir)
    main = source_dir / f"{binary}.cu"
    if not main.is_file():
        raise UserError(f"no kernel source {main}")
    t = _known_target(target)
    compiler = find_compiler(target)
    version = compiler_version(compiler)
    flags = [*t.flags, *define_flags(defines), *extra_flags]
    root = source_dir.parent
    gen = dict(sorted((generated or {}).items()))
    key = cache_key(source_files([source_dir, *shared_dirs], main), root,
                    [*flags, *(f"{k}\0{v}" for k, v in gen.items())], version)
    cache = Path(cache_dir or os.environ.get("HZ_BUILD_DIR") or DEFAULT_CACHE)
    out_dir = cache / f"{binary}-{target}-{key[:16]}"
    exe = out_dir / binary
    if exe.is_file():
        return exe
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / f"{binary}-{target}-{key[:16]}.lock")):
        if exe.is_file():  # another process built it while we waited
            return exe
        out_dir.mkdir(parents=True, exist_ok=True)
        gen_flags = []
        if gen:
            (out_dir / "include").mkdir(exist_ok=True)
            for name, text in gen.items():
                (out_dir / "include" / name).write_text(text)
            gen_flags = [f"-I{out_dir / 'include'}"]
        fd, tmp = tempfile.mkstemp(prefix=f".{binary}.", dir=out_dir)
        os.close(fd)
        cmd = [compiler, *flags, *gen_flags, "-o", tmp, str(main)]
        log = out_dir / "build.log"
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.unlink(tmp)
            raise BuildFailed(f"{compiler} timed out after {COMPILE_TIMEOUT_S:g}s building {main}") from None
        log.write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            os.unlink(tmp)
            first = next((ln for ln in (proc.stderr + proc.stdout).splitlines() if "error" in ln.lower()),
                         (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"])
            first = first if isinstance(first, str) else first[0]
            raise BuildFailed(f"building {main} for {target} failed: {first.strip()[:300]} (log: {log})")
        os.chmod(tmp, 0o755)
        os.replace(tmp, exe)
    return exe


def build_family(standalone: Path, folder: str, binary: str, **kwargs: Any) -> Path:
    """Build `standalone/<folder>/<binary>.cu` (with the harness, `standalone/common`).

    Other shared headers (`standalone/include/...`) enter the key through the include scan,
    so an edit to a header a family does not include never rebuilds it."""
    standalone = Path(standalone)
    return build(standalone / folder, binary, shared_dirs=(standalone / "common",), **kwargs)
