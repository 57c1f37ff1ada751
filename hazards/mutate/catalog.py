"""`hazards mutate --family F`: the catalog's own kernels as mutation subjects.

The subject files are the family's kernel sources (its folder under `standalone/`) and the
harness's `common/compat.h`, whose acquire/release/fence helpers every family calls; the root
copied per mutant is the whole kernel tree. A mutant builds with the family's own build
(`python3 -m hazards.mutate.catalog build F DIR OUT`: the binary from DIR instead of the
installed tree, symlinked as OUT/bin) and is judged by the binary's `--once` mode on the
variant (HZ_RESULT lines, exit codes and hangs classified by the engine like any run).
More in docs/mutate.md.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from hazards.engine import toolchain
from hazards.engine.errors import UserError
from hazards.engine.proctree import kill_and_reap

SUFFIXES = (".cu", ".cuh", ".h", ".hip")
# What the family's NVIDIA build defines and leaves undefined: compat.h's HIP and static-only
# branches are then known to be compiled away, and their look-alike sites are left alone.
NVIDIA_BUILD: dict[str, str | None] = {"__CUDACC__": "1", "__NVCC__": "1", "__HIP__": None, "__HIPCC__": None,
                                       "__HIP_PLATFORM_AMD__": None, "HZ_STATIC_ONLY": None}


def build_defines(family: str) -> dict[str, str | None]:
    """What the family's own build defines and leaves undefined, as far as it is known here:
    NVIDIA_BUILD for a CUDA family; nothing for an AMD one (its variants' -D decide)."""
    from hazards.families import get_family

    return dict(NVIDIA_BUILD) if "cuda" in get_family(family).platforms else {}


def language(family: str) -> str:
    """How the family's sources are preprocessed: 'cuda' for a CUDA family, 'hip' otherwise."""
    from hazards.families import get_family

    return "cuda" if "cuda" in get_family(family).platforms else "hip"


def subject_files(family: str, *, runnable: bool = True) -> tuple[Path, list[Path]]:
    """(the kernel tree, the files to mutate) of a family; with `runnable`, a UserError for a
    family without a runtime binary (its mutants can be listed, not judged by a run)."""
    from hazards.families import get_family
    from hazards.kernel_sources import standalone_dir

    fam = get_family(family)
    if runnable and not fam.binary:
        raise UserError(f"family {family!r} has no runtime binary: list its mutants (--list), or mutate its "
                        "sources with --build and --test")
    root = standalone_dir()
    files = sorted(p for p in fam.source_path.iterdir() if p.suffix in SUFFIXES)
    return root, [*files, root / "common" / "compat.h"]


def pick_files(family: str, files: list[Path], wanted: list[Path]) -> list[Path]:
    """The family's files that SOURCE arguments name (by path, or by file name), in their
    order; all of them when none is named. A path that is none of them is a UserError."""
    if not wanted:
        return files
    picked = []
    for w in wanted:
        hit = [f for f in files if f.resolve() == w.resolve() or (len(w.parts) == 1 and f.name == w.name)]
        if not hit:
            raise UserError(f"with --family, SOURCE picks what to mutate: {w} is not one of family {family}'s "
                            f"files ({', '.join(f.name for f in files)})")
        picked.extend(f for f in hit if f not in picked)
    return picked


def commands(family: str, variants: list[str], launches: int) -> tuple[str, str]:
    """(build, test) command lines for the kill loop: the test runs one batch of each variant
    (default: every fixed and reference variant) and stops at the first that fails."""
    from hazards.families import get_family

    fam = get_family(family)
    names = [v.name for v in fam.variants]
    unknown = [v for v in variants if v not in names]
    if unknown:
        raise UserError(f"family {family!r} has no variant {unknown[0]!r} (known: {', '.join(names)})")
    chosen = variants or [v.name for v in fam.variants if v.role in ("fixed", "reference")]
    me = f"{shlex.quote(sys.executable)} -m hazards.mutate.catalog"
    build = f"{me} build {shlex.quote(family)} {{dir}} {{out}}"
    return build, f"{me} judge {{out}}/bin {launches} " + " ".join(shlex.quote(v) for v in chosen)


def judge(binary: str, launches: int, variants: list[str]) -> int:
    """One batch of each variant in one server process of `binary`; one HZ_RESULT line for
    them all. The exit status is the one `--once` gives: 0 clean, 1 mismatch, 2 error, 3 fault."""
    proc = subprocess.Popen([binary, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    total = {"launches": 0, "mismatched": 0, "bad_elements": 0}

    def result(status: str, code: int, **extra: Any) -> int:
        print("HZ_RESULT " + json.dumps({"status": status, **total, "metrics": {"variants": variants}, **extra}),
              flush=True)
        try:
            proc.stdin.close()
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            kill_and_reap(proc)  # a broken pipe left the request buffered: close() raised before the wait
        return code

    def reply(want: int | None) -> dict[str, Any] | None:
        """The next protocol line (the handshake when `want` is None, else the reply to id `want`)."""
        for line in proc.stdout:
            if not line.startswith("{"):
                continue  # a banner
            msg = json.loads(line)
            if want is None or (msg.get("id") == want and "status" in msg):
                return msg
        return None

    if reply(None) is None:
        return result("fault", 3, message=f"{binary} --serve exited {proc.wait()} before its handshake")
    for i, variant in enumerate(variants):
        try:
            proc.stdin.write(json.dumps({"id": i, "launches": launches, "params": {"variant": variant}}) + "\n")
            proc.stdin.flush()
        except OSError:  # it stopped reading (exited, or closed its stdin): a fault, not a traceback
            return result("fault", 3, message=f"the server stopped reading its requests before {variant}")
        got = reply(i)
        if got is None:
            return result("fault", 3, message=f"the server exited {proc.wait()} during {variant}")
        for key in total:
            total[key] += int(got.get(key) or 0)
        status = got.get("status")
        if status == "fault":
            return result("fault", 3, message=f"{variant}: {got.get('message', '')}")
        if status != "ok":
            return result(str(status), 2, message=f"{variant}: {got.get('message', '')}")
        if int(got.get("mismatched") or 0) > 0:
            return result("ok", 1, variant=variant)
    return result("ok", 0)


def _build(family: str, tree: str, out: str) -> None:
    from hazards.engine.build import build_family
    from hazards.families import get_family
    from hazards.family import HEADER_NAME

    fam = get_family(family)
    exe = build_family(Path(tree), fam.source_dir or fam.name, fam.binary, target=toolchain.SM90A,
                       generated={HEADER_NAME: fam.table_header()})
    link = Path(out) / "bin"
    link.unlink(missing_ok=True)
    link.symlink_to(exe)


def prebuild(family: str, sources: list[Path], operators: list[str] | None, jobs: int) -> int:
    """Fill the build cache with the family's binary for the unmutated tree and for each
    mutant `hazards mutate --family F SOURCES --operators ...` would build (the cache key is
    the content, not the folder): a GPU round starts this beside its first rows so that a
    family whose build takes a minute (mma_pingpong's wgmma instantiations) is built by the
    time its row runs; that row's builds then hit the cache, or wait on the same compile's
    lock. Returns how many builds failed (the kill loop says which and why)."""
    import concurrent.futures as cf

    from hazards.mutate.kill import Scratch
    from hazards.mutate.mutants import check_operators, mutants_of

    root, files = subject_files(family)
    found = [(m, text) for path in pick_files(family, files, sources)
             for text, mutants in [mutants_of(path, operators=check_operators(operators), defines=build_defines(family),
                                              language=language(family))] for m in mutants]
    scratch = Scratch(root)

    def one(k: int) -> bool:
        m, text = found[k - 1] if k else (None, None)
        rel = Path(m.path).resolve().relative_to(scratch.root) if m else Path("common") / "compat.h"
        folder = scratch.copy_with(f"p{k}", rel, m.apply(text) if m else None)
        try:
            _build(family, str(folder), str(folder / ".hazards-out"))
            return True
        except Exception:  # a mutant that does not build: the kill loop reports it
            return False

    try:
        with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            ok = list(pool.map(one, range(len(found) + 1)))
    finally:
        scratch.close()
    print(f"prebuild {family}: {sum(ok)} of {len(ok)} builds cached")
    return len(ok) - sum(ok)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "build":
        _build(*sys.argv[2:])
    elif len(sys.argv) >= 5 and sys.argv[1] == "judge" and sys.argv[3].isdigit():
        sys.exit(judge(sys.argv[2], int(sys.argv[3]), sys.argv[4:]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "prebuild" and sys.argv[3].isdigit():
        ops = sys.argv[4]
        sys.exit(min(1, prebuild(sys.argv[2], [Path(p) for p in sys.argv[5:]], None if ops == "all" else [ops],
                                 int(sys.argv[3]))))
    else:
        sys.exit("usage: python3 -m hazards.mutate.catalog build FAMILY TREE OUT\n"
                 "       python3 -m hazards.mutate.catalog judge BIN LAUNCHES VARIANT...\n"
                 "       python3 -m hazards.mutate.catalog prebuild FAMILY JOBS OPERATORS|all [SOURCE...]")
