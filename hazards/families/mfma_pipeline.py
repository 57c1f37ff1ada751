"""Family `mfma_pipeline`: the MI355 megakernel PR's MFMA pipeline hazard pair, plus loop-exit parity.

The MI355 megakernel PR: a software-pipelined MFMA loop in inline asm (1) reloaded
the operand registers of an in-flight MFMA (WAR; ~17-22% of launches wrong), (2) read the
accumulator after `s_nop 7; s_nop 0` (9 wait states) where the op needs 11 (every launch
wrong), and (3) its ping-pong fix needs one exit tail per trip-count parity. Kernel:
`standalone/mfma_pipeline/mfma_pipeline.hip` + `mfma_kernel.inc`, built for gfx942 with
v_mfma_f32_32x32x8_f16 (8 passes: needs 11) or v_mfma_f32_16x16x16_f16 (4 passes: 7), and
for gfx950 with the PR's own op, v_mfma_scale_f32_16x16x128_f8f6f4 (8 passes with f8
operands: needs 12 there; the `*_scaled` variants, gfx950 only).
More in docs/families/mfma_pipeline.md.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hazards.engine import toolchain
from hazards.family import StaticVerdict, load_family
from hazards.kernel_sources import family_dir
from hazards.static import checks, mfma_table

SOURCE = family_dir("mfma_pipeline") / "mfma_pipeline.hip"
TAIL_WAIT_STATES = {32: 32, 11: 11, 9: 9}  # s_nop 15 x2, s_nop 7+2, s_nop 7+0
MNEMONIC = {32: "v_mfma_f32_32x32x8_f16", 16: "v_mfma_f32_16x16x16_f16",
            128: "v_mfma_scale_f32_16x16x128_f8f6f4"}  # 128: the MI355 PR's own op, gfx950 only
STATIC_ARCHS = toolchain.AMD_ARCHS  # the catalog judges every variant on each target's listing


def static_targets(params: dict[str, Any]) -> tuple[str, ...]:
    """The AMD targets a point can be built for: the scaled f8f6f4 op exists on gfx950 only."""
    return (toolchain.GFX950,) if FAMILY.resolve(params)["shape"] == 128 else STATIC_ARCHS


def _target(params: dict[str, Any], arch: str | None) -> str:
    """`arch`, or the point's first buildable target; a target it cannot be built for is an error."""
    targets = static_targets(params)
    if arch is not None and arch not in targets:
        raise ValueError(f"{MNEMONIC[FAMILY.resolve(params)['shape']]} is not a {arch} instruction")
    return arch or targets[0]


def _extra_wait(p: dict[str, Any]) -> int:
    """Wait states the schedule itself puts between the last MFMA and the tail (shortest
    path): the reference's s_nop 15 + 5 loop instructions, the one-bank exit test (2), the
    bank-0 tail's s_branch (1, the only tail when exits share it) or nothing (bank 1)."""
    if p["banks"] == 1:
        return 21 if not p["overlap"] else 2
    return 0 if p["exit_tails"] == 2 else 1


def predicted_checks(params: dict[str, Any], arch: str | None = None) -> set[str]:
    """The AMDGCN check ids this point must trigger on `arch` (empty = clean): gfx950 asks
    one wait state more of a 4- or 8-pass XDL result (the 11-wait-state tail that suffices
    for the 8-pass op on gfx942 is short there)."""
    p = FAMILY.resolve(params)
    arch = _target(p, arch)
    shape = mfma_table.lookup(MNEMONIC[p["shape"]], arch)
    need = mfma_table.required_wait_states(shape, "valu")
    out = set()
    if p["banks"] == 1 and p["overlap"]:
        out.add(checks.MFMA_SRC_WAR.id)
    if TAIL_WAIT_STATES[p["tail"]] + _extra_wait(p) < need:
        out.add(checks.MFMA_ACC_READ.id)
    if p["banks"] == 2 and p["exit_tails"] == 1:
        out.add(checks.MFMA_EXIT_PARITY.id)
    return out


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous iff a source bank is reloaded in flight, the tail is short for the shape,
    or two banks share one exit tail."""
    p = FAMILY.resolve(params)
    found = predicted_checks(params)
    if not found:
        return StaticVerdict(False, f"{MNEMONIC[p['shape']]}: disjoint reloads, tail long "
                                    "enough, every exit parity consumes its own bank")
    return StaticVerdict(True, ", ".join(sorted(found)))


def strategy() -> Any:
    """Schedule points: shape, banks (one bank: overlapped or not), exit tails, tail length."""
    def point(variant, shape, banks, overlap, exit_tails, tail):
        return {"variant": variant, "shape": shape, "banks": banks,
                "overlap": overlap if banks == 1 else True, "exit_tails": exit_tails,
                "tail": tail}
    return st.builds(point, st.sampled_from([v.name for v in FAMILY.variants]), st.sampled_from([32, 16]),
                     st.sampled_from([1, 2]), st.booleans(), st.sampled_from([1, 2]),
                     st.sampled_from(sorted(TAIL_WAIT_STATES)))


def static_check(params: dict[str, Any], arch: str | None = None):
    """Findings for one point: the AMDGCN checks on the assembly clang emits for `arch`
    (clang-19 for gfx942, clang-22 for gfx950; default: the point's first target)."""
    from hazards.static import amdgcn

    arch = _target(params, arch)
    d = FAMILY.defines(params)
    label = FAMILY.build_label(params)
    return amdgcn.compile_and_check(SOURCE, arch=arch, defines=d, label=f"{label}-{arch}")


# Parameters (-D of the point build), variants and their reasons: standalone/mfma_pipeline/family.toml.
FAMILY = load_family("mfma_pipeline", static_model=static_model, strategy=strategy,
                     static_check=static_check, predicted_checks=predicted_checks, static_archs=STATIC_ARCHS,
                     static_targets=static_targets)
