"""Family `mma_pingpong`: the MI355 megakernel PR's software-pipelined MMA loop on Hopper (sm_90a).

Bulk copies stream K-tiles into shared-memory operand banks that `wgmma.mma_async` reads
asynchronously. Kernel: `standalone/mma_pingpong/mma_pingpong.cu` (+ `wgmma.cuh`). The tile
shape, the `wgmma.wait_group` depth W and the accumulator-read placement are template arguments
(so the SASS of each schedule is definite), and so is who refills a bank (thread 0's bulk
copies or every thread's `st.shared`); the bank count, trip count, exit tail, jitter and grid
are run-time parameters. Hazards: the bank refill while its last reader may be in flight (W >=
stages), the single exit tail (wrong when (T-1) % stages != 0), and the accumulators read
before the retiring wait (undefined in PTX; ptxas serializes the kernel, so only the static
checks see it). Oracles: every launch bit-exact against the reference schedule, whose output is
checked against a double-precision host GEMM each batch; the SASS checks of
`hazards.static.wgmma` on the compiled kernels.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from hazards.family import StaticVerdict, combined_rate, load_family
from hazards.kernel_sources import family_dir
from hazards.static import checks

SOURCE = family_dir("mma_pingpong") / "mma_pingpong.cu"


def effective_wait_depth(p: dict[str, Any]) -> int:
    """The wgmma.wait_group depth the kernel is compiled with for this point."""
    return int(p["wait_depth"]) if int(p["wait_depth"]) >= 0 else min(int(p["stages"]) - 1, MAX_WAIT)


# Per-launch rates on the H200 (docs/results/mma-pingpong-h200.md): the single exit tail reads
# a wrong bank in every launch; the bulk-copy WAR was never seen (0 in 72,000 launches over
# 37 points: the bank's reader is done before a bulk copy lands); the early accumulator read
# is repaired by ptxas (it serializes the kernel's wgmmas). The threads' st.shared refill
# (made runnable later) has no measured rate yet: its WAR is hazardous, rate not predicted.
TAIL_RATE, WAR_RATE, ACC_READ_RATE = 1.0, 0.0, 0.0


def hazards_with_rates(params: dict[str, Any]) -> list[tuple[str, float]]:
    """Every hazard of the source at this parameter point, in words, with the per-launch rate
    the model predicts for it on the H200. Empty: safe."""
    p = FAMILY.resolve(params)
    s, t, w = int(p["stages"]), int(p["ktiles"]), effective_wait_depth(p)
    found = []
    if w >= s and t >= s + 1:
        threads = p["refill"] == "threads"
        by = "the threads' st.shared refill" if threads else "the bulk copy"
        found.append((f"WAR: wait_group {w} leaves the group that last read bank (t+1)%{s} in flight "
                      f"when {by} refills it (deepest safe wait: {s - 1})", None if threads else WAR_RATE))
    if p["tail"] == "single" and (t - 1) % s != 0:
        found.append((f"exit tail reads bank 0 but the last tile (T={t}) sits in bank {(t - 1) % s}", TAIL_RATE))
    if p["acc_read"] == "before_wait":
        found.append(("accumulators read before wait_group 0 retires the last wgmma (ptxas "
                      "serializes every wgmma of the kernel: correct but slow, C7514)", ACC_READ_RATE))
    return found


def hazards(params: dict[str, Any]) -> list[str]:
    """Every hazard of the source at this parameter point, in words (empty: safe)."""
    return [what for what, _ in hazards_with_rates(params)]


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous or safe from the parameters alone. The WAR race needs a refill (T >= S+1)
    and shows only when the copy lands before the in-flight wgmma has read its operands; the
    early accumulator read is a source hazard the compiler repairs (runtime-clean). The rate
    is the H200's per launch (`hazards_with_rates`)."""
    found = hazards_with_rates(params)
    if found:
        return StaticVerdict(True, "; ".join(w for w, _ in found), combined_rate([r for _, r in found]))
    return StaticVerdict(False, "refills wait for the bank's last reader, the exit tail reads "
                                "the last tile's bank, accumulators read after the final wait", 0.0)


def predicted_checks(params: dict[str, Any]) -> set[str]:
    """The check ids the emitted code of this point must trigger (independent of T: the refill
    code is there whether or not a launch reaches it)."""
    p = FAMILY.resolve(params)
    if p["acc_read"] == "before_wait":
        return {checks.WGMMA_EARLY_ACCESS.id}  # serialized: no wgmma is in flight at a refill
    return {checks.WGMMA_REFILL_IN_FLIGHT.id} if effective_wait_depth(p) >= int(p["stages"]) else set()


def kernel_symbol(params: dict[str, Any]) -> str:
    """The part of the mangled kernel name that selects this point's instantiation."""
    p = FAMILY.resolve(params)
    bn, bk = p["shape"].split("x")
    early = 1 if p["acc_read"] == "before_wait" else 0
    threads = 1 if p["refill"] == "threads" else 0
    return f"mma_pingpong_kernelILi{bn}ELi{bk}ELi{effective_wait_depth(p)}ELb{early}ELb{threads}EE"


@functools.lru_cache(maxsize=4)
def _compiled(source: str, mtime: float, shape: str) -> tuple[Any, Any, tuple[Any, ...]]:
    """(cubin build with ptxas' log, SASS listing, parsed functions) of the family source
    built with one tile shape's kernels (`HZ_MMA_SHAPES`): every point of that shape is
    checked on it (the build is cached on disk too)."""
    from hazards.static.compile import compile_cubin, disassemble
    from hazards.static.sass import parse_sass

    mask = 1 << SHAPES.index(shape)
    build = compile_cubin(Path(source), defines={"HZ_MMA_SHAPES": mask}, label=f"mma_pingpong-{shape}")
    listing = disassemble(build.path)
    return build, listing, tuple(parse_sass(listing.text))


def static_check(params: dict[str, Any]):
    """Findings for one point: the wgmma SASS checks on the kernel instantiation it runs
    (ring of `stages` banks, refilled by bulk copies or by `STS`) and ptxas' diagnostics for it."""
    from hazards.engine.errors import UserError
    from hazards.static import wgmma

    from hazards.static.compile import require_sass_tools

    p = FAMILY.resolve(params)
    require_sass_tools()  # before the in-memory cache: `--skip nvcc` must skip a cached build too
    build, listing, funcs = _compiled(str(SOURCE), SOURCE.stat().st_mtime, p["shape"])
    sym = kernel_symbol(p)
    mine = [f for f in funcs if sym in f.name]
    if not mine:
        raise UserError(f"no kernel {sym} in {listing.path}: the SASS check could not look")
    stores = p["refill"] == "threads"
    found = [x for f in mine
             for x in wgmma.check_function(f, str(listing.path), banks=int(p["stages"]), store_refills=stores)]
    return found + wgmma.check_ptxas_log(build.log, str(SOURCE), functions=[sym])


def strategy() -> Any:
    """A variant plus any subset of overrides: tile shape, banks, wait depth (including one
    too shallow), trip count with both parities and the small counts around the bank count,
    exit tail, accumulator-read placement, bulk or thread-store refills, jitter between the MMA issue and the refill, warp skew, how
    long each tile's MMA batch reads its bank (`mma_reps`), and small grids (cheap on a GPU)."""
    overrides = st.fixed_dictionaries({}, optional={
        "shape": st.sampled_from(SHAPES),
        "stages": st.integers(1, 4),
        "wait_depth": st.integers(-1, MAX_WAIT),
        "tail": st.sampled_from(["parity", "single"]),
        "acc_read": st.sampled_from(["after_wait", "before_wait"]),
        "refill": st.sampled_from(["bulk", "threads"]),
        "ktiles": st.one_of(st.integers(1, 6), st.integers(7, 64)),
        "jitter": st.integers(0, 16),
        "warp_skew": st.sampled_from([0, 1, 16]),
        "mma_reps": st.sampled_from([1, 2, 4, 8, 16]),
        "blocks": st.sampled_from([1, 8, 66, 132]),
    })
    variants = st.sampled_from([v.name for v in FAMILY.variants])
    points = st.builds(lambda v, o: {"variant": v, **o}, variants, overrides)
    return points.filter(_compiled_pair)


def _compiled_pair(point: dict[str, Any]) -> bool:
    """The thread refill is compiled with the accumulators read after the final wait only
    (the binary refuses the other pair)."""
    p = FAMILY.resolve(point)
    return not (p["refill"] == "threads" and p["acc_read"] == "before_wait")


# Parameters, variants and their reasons: standalone/mma_pingpong/family.toml.
FAMILY = load_family("mma_pingpong", static_model=static_model, strategy=strategy,
                     static_check=static_check, predicted_checks=predicted_checks)
SHAPES: tuple[str, ...] = FAMILY.param("shape").choices  # BN x BK compiled (BM = 64)
MAX_WAIT: int = int(FAMILY.param("wait_depth").max)  # wait depths compiled: 0..MAX_WAIT
