"""Build the ragged-decode megakernel into a shared library, cached by source hash.

`build_library()` runs ``nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -shared
-Xcompiler -fPIC`` on ``standalone/megakernel/ragged_decode.cu`` and keeps the result in the
per-user build cache (`hazards.engine.toolchain.cache_dir("megakernel")`, under
`$HZ_BUILD_DIR` when set), named by a hash of the sources (the .cu and every header it
includes), the flags and the compiler's release line, so a rebuild happens only when one of
them changes. The ptxas resource report (registers, spills, stack) is kept beside the
library. No torch here: building needs only nvcc.

Run ``python3 -m hazards.megakernel.build`` to build and print the report.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hazards.engine import toolchain
from hazards.engine.errors import UserError
from hazards.kernel_sources import family_dir

SOURCE = family_dir("megakernel") / "ragged_decode.cu"
NVCC_FLAGS = ("-O3", *toolchain.nvcc_arch_flags(toolchain.SM90A), "-shared", "-Xcompiler", "-fPIC",
              "-Xptxas", "-v")


def find_nvcc() -> str:
    """Path of nvcc; ToolchainMissing naming how to install it if there is none."""
    return toolchain.find_tool("nvcc", needed_for="to build the ragged-decode megakernel")


def library_path(nvcc: str | None = None) -> Path:
    """The cache path the current source, flags and compiler map to."""
    nvcc = nvcc or find_nvcc()
    key = toolchain.cache_key(toolchain.included_files(SOURCE), NVCC_FLAGS, toolchain.tool_version(nvcc))
    return toolchain.cache_dir("megakernel") / f"ragged_decode-{key[:16]}.so"


def build_library() -> Path:
    """Compile the library if this source/flags/compiler has not been built; return its path."""
    nvcc = find_nvcc()
    out = library_path(nvcc)

    def compile_to(tmp: Path) -> None:
        try:
            proc = subprocess.run([nvcc, *NVCC_FLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True,
                                  text=True, check=False, timeout=toolchain.COMPILE_TIMEOUT_S)
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
