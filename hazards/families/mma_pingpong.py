"""Family `mma_pingpong`: the MI355 megakernel PR's software-pipelined MMA loop on Hopper
(sm_90a): bulk copies stream K-tiles into shared-memory operand banks that
`wgmma.mma_async` reads asynchronously.

Kernel: `standalone/mma_pingpong/mma_pingpong.cu` (+ `wgmma.cuh`). The tile shape, the
`wgmma.wait_group` depth W and the accumulator-read placement are template arguments (so
the SASS of each schedule is definite); the bank count, trip count, exit tail, jitter and
grid are run-time parameters. Hazards: the bank refill while its last reader may be in
flight (W >= stages), the single exit tail (wrong when (T-1) % stages != 0), and the
accumulators read before the retiring wait (undefined in PTX; ptxas serializes the kernel,
so only the static checks see it). Oracles: every launch bit-exact against the reference
schedule, whose output is checked against a double-precision host GEMM each batch; the
SASS checks of `hazards.static.wgmma` on the compiled kernels.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from hazards import presets
from hazards.family import STANDALONE, Family, StaticVerdict, Variant
from hazards.static import checks

SOURCE = STANDALONE / "mma_pingpong" / "mma_pingpong.cu"
SHAPES = ("64x16", "128x64", "256x64")  # BN x BK compiled (BM = 64)
MAX_WAIT = 3  # wait depths compiled: 0..3

# The binary's declared defaults (mma_pingpong.cu's ParamSpec list); tests/families checks
# this against `mma_pingpong --list`.
DEFAULTS: dict[str, Any] = {
    "shape": "128x64", "stages": 2, "wait_depth": -1, "tail": "parity", "acc_read": "after_wait",
    "ktiles": 16, "jitter": 0, "mma_reps": 8, "blocks": 0, "inputs": "uniform",
}

VARIANTS = (
    Variant("reference", "reference", "one bank, wait_group 0 before every refill: no overlap",
            params={"stages": 1, "wait_depth": 0}),
    Variant("fixed", "fixed", "two banks ping-ponged, wait_group 1 retires the bank being refilled, "
            "parity exit tail", params={"stages": 2, "wait_depth": 1}),
    Variant("broken_war", "broken", "one bank refilled after wait_group 1: the copy overwrites the "
            "in-flight wgmma's operands", params={"stages": 1, "wait_depth": 1, "mma_reps": 16},
            detected_by=("stress", "static")),
    Variant("broken_tail", "broken", "the fixed ping-pong with a single exit tail (bank 0), even "
            "trip count", params={"stages": 2, "wait_depth": 1, "tail": "single", "ktiles": 16},
            detected_by=("stress",)),
    Variant("broken_acc_read", "broken", "the fixed ping-pong storing the accumulators before "
            "wait_group 0", params={"stages": 2, "wait_depth": 1, "acc_read": "before_wait"},
            detected_by=("static",)),
)
_BY_NAME = {v.name: v for v in VARIANTS}

RUNTIME_PARAMS = {
    "shape": "tile BNxBK (BM = 64: one warpgroup): " + " | ".join(SHAPES),
    "stages": "shared-memory operand banks S, 1-4",
    "wait_depth": "wgmma.wait_group depth before a refill, 0-3 (-1: S-1, the deepest safe overlap)",
    "tail": "parity | single: exit tail reads bank (T-1)%S, or always bank 0",
    "acc_read": "after_wait | before_wait: the epilogue reads the accumulators after or before wait_group 0",
    "ktiles": "trip count T (K = BK*T), 1-128",
    "jitter": "thread 0 spins up to jitter*64 clocks before each refill",
    "mma_reps": "each tile's wgmma batch is issued this many times, 1-16 (K' = reps*K): how long "
                "the tensor core reads a bank relative to the copy that refills it",
    "blocks": "grid size (0: one per SM)",
    "inputs": "uniform | probe_rows | probe_cols: random bf16, or exact probes naming what the MMA read",
}


def resolve(params: dict[str, Any]) -> dict[str, Any]:
    """Defaults <- the named variant's preset <- explicit fields (as the binary resolves)."""
    return presets.resolve(DEFAULTS, VARIANTS, params)


def effective_wait_depth(p: dict[str, Any]) -> int:
    """The wgmma.wait_group depth the kernel is compiled with for this point."""
    return int(p["wait_depth"]) if int(p["wait_depth"]) >= 0 else min(int(p["stages"]) - 1, MAX_WAIT)


def hazards(params: dict[str, Any]) -> list[str]:
    """Every hazard of the source at this parameter point, in words (empty: safe)."""
    p = resolve(params)
    s, t, w = int(p["stages"]), int(p["ktiles"]), effective_wait_depth(p)
    found = []
    if w >= s and t >= s + 1:
        found.append(f"WAR: wait_group {w} leaves the group that last read bank (t+1)%{s} in flight "
                     f"when the bulk copy refills it (deepest safe wait: {s - 1})")
    if p["tail"] == "single" and (t - 1) % s != 0:
        found.append(f"exit tail reads bank 0 but the last tile (T={t}) sits in bank {(t - 1) % s}")
    if p["acc_read"] == "before_wait":
        found.append("accumulators read before wait_group 0 retires the last wgmma (ptxas "
                     "serializes every wgmma of the kernel: correct but slow, C7514)")
    return found


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous or safe from the parameters alone. The WAR race needs a refill (T >= S+1)
    and shows only when the copy lands before the in-flight wgmma has read its operands; the
    early accumulator read is a source hazard the compiler repairs (runtime-clean)."""
    found = hazards(params)
    if found:
        return StaticVerdict(True, "; ".join(found))
    return StaticVerdict(False, "refills wait for the bank's last reader, the exit tail reads "
                                "the last tile's bank, accumulators read after the final wait")


def predicted_checks(params: dict[str, Any]) -> set[str]:
    """The check ids the emitted code of this point must trigger (independent of T: the refill
    code is there whether or not a launch reaches it)."""
    p = resolve(params)
    if p["acc_read"] == "before_wait":
        return {checks.WGMMA_EARLY_ACCESS.id}  # serialized: no wgmma is in flight at a refill
    return {checks.WGMMA_REFILL_IN_FLIGHT.id} if effective_wait_depth(p) >= int(p["stages"]) else set()


def kernel_symbol(params: dict[str, Any]) -> str:
    """The part of the mangled kernel name that selects this point's instantiation."""
    p = resolve(params)
    bn, bk = p["shape"].split("x")
    early = 1 if p["acc_read"] == "before_wait" else 0
    return f"mma_pingpong_kernelILi{bn}ELi{bk}ELi{effective_wait_depth(p)}ELb{early}EE"


@functools.lru_cache(maxsize=2)
def _compiled(source: str, mtime: float) -> tuple[Any, Any, tuple[Any, ...]]:
    """(cubin build with ptxas' log, SASS listing, parsed functions) of the family source;
    one compile serves every point (the build is cached on disk too)."""
    from hazards.static.compile import compile_cubin, disassemble
    from hazards.static.sass import parse_sass

    build = compile_cubin(Path(source), label="mma_pingpong")
    listing = disassemble(build.path)
    return build, listing, tuple(parse_sass(listing.text))


def static_check(params: dict[str, Any]):
    """Findings for one point: the wgmma SASS checks on the kernel instantiation it runs
    (ring of `stages` banks) and ptxas' diagnostics for it."""
    from hazards.engine.errors import UserError
    from hazards.static import wgmma

    p = resolve(params)
    build, listing, funcs = _compiled(str(SOURCE), SOURCE.stat().st_mtime)
    sym = kernel_symbol(p)
    mine = [f for f in funcs if sym in f.name]
    if not mine:
        raise UserError(f"no kernel {sym} in {listing.path}: the SASS check could not look")
    found = [x for f in mine for x in wgmma.check_function(f, str(listing.path), banks=int(p["stages"]))]
    return found + wgmma.check_ptxas_log(build.log, str(SOURCE), functions=[sym])


def strategy() -> Any:
    """Hypothesis strategy over run-time parameter points (see hazards/strategies)."""
    from hazards.strategies.mma_pingpong import mma_pingpong_points

    return mma_pingpong_points(tuple(_BY_NAME))


FAMILY = Family(
    name="mma_pingpong",
    summary="bulk-copy-fed wgmma GEMM loop (sm_90a): operand-bank WAR, exit-tail parity, "
            "accumulators read before the retiring wait",
    variants=VARIANTS,
    static_model=static_model,
    strategy=strategy,
    source_dir="mma_pingpong",
    binary="mma_pingpong",
    platforms=("cuda",),
    default_launches=200,
    timeout_s=30.0,
    runtime_params=RUNTIME_PARAMS,
)
