"""Build the ragged-decode megakernel into a shared library, cached by source hash.

`build_library()` runs ``nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -shared
-Xcompiler -fPIC`` on ``standalone/megakernel/ragged_decode.cu`` and keeps the result under
``build/megakernel/`` (override: ``HZ_MEGAKERNEL_BUILD_DIR``), named by a hash of the
sources (the .cu and its .cuh headers), the flags and the compiler's version, so a rebuild happens only when one of them
changes. The ptxas resource report (registers, spills, stack) is kept beside the library.
No torch here: building needs only nvcc.

Run ``python3 -m hazards.megakernel.build`` to build and print the report.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hazards.engine.errors import ToolchainMissing, UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = REPO_ROOT / "standalone" / "megakernel" / "ragged_decode.cu"
NVCC_FLAGS = ("-O3", "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
              "-Xptxas", "-v")


def find_nvcc() -> str:
    """Path of nvcc (HZ_NVCC, PATH, or /usr/local/cuda/bin/nvcc); ToolchainMissing if none."""
    for cand in (os.environ.get("HZ_NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise ToolchainMissing("nvcc is not installed (install the CUDA toolkit or set HZ_NVCC); "
                           "the ragged-decode megakernel is built with it")


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout


def build_dir() -> Path:
    """Where built libraries live (created on demand; gitignored)."""
    d = Path(os.environ.get("HZ_MEGAKERNEL_BUILD_DIR", REPO_ROOT / "build" / "megakernel"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def library_path(nvcc: str | None = None) -> Path:
    """The cache path the current source, flags and compiler map to."""
    nvcc = nvcc or find_nvcc()
    key = hashlib.sha256()
    for src in sorted(SOURCE.parent.glob("*.cu*")):  # the kernel and the headers it includes
        key.update(src.name.encode() + b"\0" + src.read_bytes())
    key.update("\0".join(NVCC_FLAGS).encode())
    key.update(_nvcc_version(nvcc).encode())
    return build_dir() / f"ragged_decode-{key.hexdigest()[:16]}.so"


def build_library() -> Path:
    """Compile the library if this source/flags/compiler has not been built; return its path."""
    nvcc = find_nvcc()
    out = library_path(nvcc)
    if out.exists():
        return out
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.tmp.so")
    proc = subprocess.run([nvcc, *NVCC_FLAGS, "-o", str(tmp), str(SOURCE)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise UserError(f"nvcc failed to build {SOURCE.name}: {proc.stderr.strip()[-2000:]}")
    out.with_suffix(".ptxas.txt").write_text(proc.stderr)
    os.replace(tmp, out)  # atomic: a concurrent builder never sees half a library
    return out


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
