"""Build the ragged-decode megakernel into a shared library, cached by source hash.

`build_library()` runs ``nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -shared
-Xcompiler -fPIC`` on ``standalone/megakernel/ragged_decode.cu`` and keeps the result in the
per-user build cache (`hazards.engine.toolchain.cache_dir("megakernel")`, under
`$HZ_BUILD_DIR` when set), named by a hash of the sources (the .cu and every header it
includes), the flags and the compiler's release line, so a rebuild happens only when one of
them changes. The ptxas resource report (registers, spills, stack) is kept beside the
library. No torch here: building needs only nvcc. `build_library(profiler=True)` builds the
-DHZ_PROFILER variant (per-task spans, standalone/include/hz_profiler.h); `defines` adds
further -D flags (a candidate build of the perf gate). More in docs/megakernel.md.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hazards.engine import toolchain
from hazards.engine.errors import UserError
from hazards.engine.proctree import run_in_group
from hazards.kernel_sources import family_dir

SOURCE = family_dir("megakernel") / "ragged_decode.cu"
NVCC_FLAGS = ("-O3", *toolchain.nvcc_arch_flags(toolchain.SM90A), "-shared", "-Xcompiler", "-fPIC",
              "-Xptxas", "-v")


def _flags(profiler: bool, defines: tuple[str, ...]) -> list[str]:
    for d in defines:
        if not d or not all(c.isalnum() or c in "_=" for c in d) or d[0].isdigit():
            raise UserError(f"bad define {d!r}: use NAME or NAME=VALUE (letters, digits, _)")
    return [*NVCC_FLAGS, *(["-DHZ_PROFILER"] if profiler else []),
            *(f"-D{d}" for d in sorted(set(defines)))]


def find_nvcc() -> str:
    """Path of nvcc; ToolchainMissing naming how to install it if there is none."""
    return toolchain.find_tool("nvcc", needed_for="to build the ragged-decode megakernel")


def library_path(nvcc: str | None = None, *, profiler: bool = False, defines: tuple[str, ...] = ()) -> Path:
    """The cache path the current source, flags, defines and compiler map to."""
    nvcc = nvcc or find_nvcc()
    flags = _flags(profiler, defines)
    key = toolchain.cache_key(toolchain.included_files(SOURCE), flags, toolchain.tool_version(nvcc))
    tag = "-prof" if profiler else ""
    return toolchain.cache_dir("megakernel") / f"ragged_decode{tag}-{key[:16]}.so"


def build_library(*, profiler: bool = False, defines: tuple[str, ...] = ()) -> Path:
    """Compile the library if this source/flags/compiler has not been built; return its path."""
    nvcc = find_nvcc()
    out = library_path(nvcc, profiler=profiler, defines=defines)

    def compile_to(tmp: Path) -> None:
        try:
            # in its own process group: a timeout kills cicc/ptxas/gcc too, not nvcc alone
            proc = run_in_group([nvcc, *_flags(profiler, defines), "-o", str(tmp), str(SOURCE)],
                                toolchain.COMPILE_TIMEOUT_S, text=True)
        except subprocess.TimeoutExpired:
            raise UserError(f"nvcc timed out after {toolchain.COMPILE_TIMEOUT_S:g} s building {SOURCE.name}") from None
        if proc.returncode != 0:
            raise UserError(f"nvcc failed to build {SOURCE.name}: {proc.stderr.strip()[-2000:]}")
        out.with_suffix(".ptxas.txt").write_text(proc.stderr)

    return toolchain.cached_output(out, compile_to)


def ptxas_report(lib: Path) -> str:
    """The ptxas -v lines kept beside a built library ('' if none)."""
    rep = lib.with_suffix(".ptxas.txt")
    return rep.read_text() if rep.exists() else ""


def main() -> int:
    """Build, print the library path and the ptxas resource lines."""
    lib = build_library()
    print(lib)
    for line in ptxas_report(lib).splitlines():
        if any(w in line for w in ("registers", "spill", "stack")):
            print(line.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
