"""Build a family's standalone binary for a GPU target, cached by content.

A family's kernel folder (`standalone/<family>/`) holds one `<binary>.cu` that includes the
harness (`standalone/common/`) and maybe shared headers (`standalone/include/`). `build()`
compiles it with nvcc for `sm_90a` (or hipcc for `gfx942` where ROCm is installed) and
caches the binary in the per-user build cache (`hazards.engine.toolchain.cache_dir`,
`$HZ_BUILD_DIR` overrides) keyed by every source file in those folders, the compile flags,
the compile-time defines, the generated headers and the compiler's release line: an
unchanged tree never recompiles, and a new compiler or flag always does. More in docs/harness.md.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import toolchain
from .errors import UserError
from .proctree import run_in_group


class BuildFailed(UserError):
    """The compiler ran and rejected the sources."""


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """How to compile a harness binary for one GPU architecture."""

    name: str
    tool: str              # a key of toolchain.TOOLS
    flags: tuple[str, ...]


TARGETS: dict[str, GpuTarget] = {
    # -split-compile=0: ptxas compiles the kernels of one file on every core (the template
    # families instantiate dozens of wgmma kernels: minutes serially, seconds on a GPU host's
    # 16 cores). The machine code is not always the same as a build without it: address spaces
    # are not inferred across out-of-line functions, so their pointer arguments' loads stay
    # generic (LD.E, not LDG.E; the layered megakernel's tasks, tests/megakernel_layers/
    # test_copy_ahead.py). A SASS test of a family binary reads a build with these flags
    # (target_flags; tests/megakernel_layers/test_merge_spread.py's family_cubin). With them the
    # code also depends on the source's folder: the anonymous namespace's mangled name carries a
    # hash of its path, and ptxas then infers some address spaces otherwise (production: 5 stores of
    # attend_chunk STG.E in one checkout, ST.E in another; test_production_step22.py's pin).
    toolchain.SM90A: GpuTarget(toolchain.SM90A, "nvcc",
                               ("-O3", "-std=c++17", "-lineinfo", "-split-compile=0",
                                *toolchain.nvcc_arch_flags(toolchain.SM90A))),
    toolchain.GFX942: GpuTarget(toolchain.GFX942, "hipcc",
                                ("-O3", "-std=c++17", toolchain.amd_arch_flag(toolchain.GFX942))),
}


def _known_target(target: str) -> GpuTarget:
    if target not in TARGETS:
        raise UserError(f"unknown build target {target!r} (known: {', '.join(TARGETS)})")
    return TARGETS[target]


def target_flags(target: str = toolchain.SM90A) -> tuple[str, ...]:
    """The compile flags of a harness build for `target` (before its defines): what `build` passes,
    and what a CPU test's cubin of a family source passes (hazards.static.compile.compile_cubin with
    `harness_flags=True`) to read the machine code the GPU runs, not a build's with other flags."""
    return _known_target(target).flags


def find_compiler(target: str) -> str:
    """Path of the compiler for `target`; ToolchainMissing (one line) if there is none."""
    return toolchain.find_tool(_known_target(target).tool, needed_for=f"to build for {target}")


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


def build(source_dir: Path, binary: str, *, target: str = toolchain.SM90A,
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
    compiler = find_compiler(target)
    flags = [*target_flags(target), *define_flags(defines), *extra_flags]
    gen = dict(sorted((generated or {}).items()))
    key = toolchain.cache_key(toolchain.source_files([source_dir, *shared_dirs], main),
                              [*flags, *(f"{k}\0{v}" for k, v in gen.items())],
                              toolchain.tool_version(compiler), root=source_dir.parent)
    out_dir = Path(cache_dir) if cache_dir else toolchain.cache_dir("family")
    out_dir = out_dir / f"{binary}-{target}-{key[:16]}"

    def compile_to(tmp: Path) -> None:
        gen_flags = []
        if gen:
            (out_dir / "include").mkdir(exist_ok=True)
            for name, text in gen.items():
                (out_dir / "include" / name).write_text(text)
            gen_flags = [f"-I{out_dir / 'include'}"]
        cmd = [compiler, *flags, *gen_flags, "-o", str(tmp), str(main)]
        log = out_dir / "build.log"
        try:
            proc = run_in_group(cmd, toolchain.COMPILE_TIMEOUT_S, text=True)  # nvcc's children die with it
        except subprocess.TimeoutExpired:
            raise BuildFailed(f"{compiler} timed out after {toolchain.COMPILE_TIMEOUT_S:g}s building {main}") from None
        log.write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            lines = (proc.stderr + proc.stdout).splitlines()
            first = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "(no output)")
            raise BuildFailed(f"building {main} for {target} failed: {first.strip()[:300]} (log: {log})")
        os.chmod(tmp, 0o755)

    out_dir.mkdir(parents=True, exist_ok=True)
    return toolchain.cached_output(out_dir / binary, compile_to)


def build_family(standalone: Path, folder: str, binary: str, **kwargs: Any) -> Path:
    """Build `standalone/<folder>/<binary>.cu` (with the harness, `standalone/common`).

    Other shared headers (`standalone/include/...`) enter the key through the include scan,
    so an edit to a header a family does not include never rebuilds it."""
    standalone = Path(standalone)
    return build(standalone / folder, binary, shared_dirs=(standalone / "common",), **kwargs)
