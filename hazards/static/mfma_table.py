"""MFMA pass counts and the wait states a dependent instruction needs, per target.

Sources (cited, and cross-checked on this machine):

- The rules are LLVM's AMDGPU hazard recognizer, `llvm/lib/Target/AMDGPU/
  GCNHazardRecognizer.cpp`, gfx940 branch (gfx940/941/942 = MI300, CDNA3):
  * `GFX940_XDL_N_PassWriteVgprVALUMemExpReadWaitStates`   = passes + 3  (XDL result read by
    a VALU - v_accvgpr_read included -, a memory op or an export)
  * `GFX940_SMFMA_N_PassWriteVgprVALUMemExpReadWaitStates` = passes + 2  (non-XDL: the f32 MFMAs)
  * `GFX940_XDL_N_PassWritesVGPROverlappedSrcABWaitStates` = passes + 3, SMFMA passes + 2
    (a later MFMA reads the result as SrcA/SrcB)
  * `GFX940_XDL_N_PassWritesVGPROverlappedSMFMASrcCWaitStates` = passes + 1, SMFMA passes
    (partially overlapping SrcC); exactly the same registers as SrcC: 0 (the hardware
    interlocks an accumulation chain), except 2-pass MFMAs which need 2
    (`GFX940_SMFMA4x4WritesVGPRFullSrcCWaitStates`)
  * DGEMM (f64): `DMFMA4x4WriteVgprVALUReadWaitStates` 6 / `...MemExpReadWaitStates` 9,
    `DMFMA16x16WriteVgprVALUReadWaitStates` 11 / `...MemExpReadWaitStates` 18.
- The pass counts for gfx942 are LLVM's scheduling model (`computeInstrLatency` of the MFMA),
  read back from clang-19's own output: tests/static/test_mfma_table.py compiles one kernel
  per intrinsic for gfx942 and asserts that the wait states LLVM inserted before the first
  read of each result equal `required_wait_states(...)` here, for every gfx942 row.
- gfx950 (MI350/MI355, CDNA4): clang-19 cannot target it, so its rows come from
  the MI355 megakernel PR: `v_mfma_scale_f32_16x16x128_f8f6f4` is a 32-cycle (8-pass) op,
  the measured threshold before `v_accvgpr_read_b32` is 11 wait states (10 fails 300/300,
  11 passes 300/300) and LLVM's recognizer emits exactly `s_nop 7; s_nop 2` (8 + 3 = 11).
  Pass counts are the f8 ones (the longest; f4/f6 operands take half). Not cross-checked
  against a compiler here; the mnemonics pass through `clang-19 -S` unassembled.

One wait state is one issue slot; `s_nop N` provides N+1. The MI355 megakernel PR calls
them clocks.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

ReaderKind = Literal["valu", "mem", "srcab", "srcc_partial", "srcc_full"]


@dataclasses.dataclass(frozen=True)
class MfmaShape:
    """One MFMA instruction on one target: how many passes it takes and its pipeline class."""

    mnemonic: str
    passes: int
    kind: Literal["xdl", "smfma", "dgemm"]
    source: str

    @property
    def cycles(self) -> int:
        """Cycles the op occupies the matrix pipe (4 per pass)."""
        return 4 * self.passes


_LLVM = "LLVM GCNHazardRecognizer gfx940 rules + SISchedule pass count (checked vs clang-19)"
_MI355_PR = "the MI355 megakernel PR (32-cycle op, measured threshold 11 on MI355)"

_GFX942 = {
    # non-XDL ("SMFMA") on gfx940: the f32-input shapes
    "v_mfma_f32_32x32x1_2b_f32": (16, "smfma"), "v_mfma_f32_16x16x1_4b_f32": (8, "smfma"),
    "v_mfma_f32_4x4x1_16b_f32": (2, "smfma"), "v_mfma_f32_32x32x2_f32": (16, "smfma"),
    "v_mfma_f32_16x16x4_f32": (8, "smfma"),
    # XDL
    "v_mfma_f32_32x32x4_2b_f16": (16, "xdl"), "v_mfma_f32_16x16x4_4b_f16": (8, "xdl"),
    "v_mfma_f32_4x4x4_16b_f16": (2, "xdl"), "v_mfma_f32_32x32x8_f16": (8, "xdl"),
    "v_mfma_f32_16x16x16_f16": (4, "xdl"),
    "v_mfma_f32_32x32x4_2b_bf16": (16, "xdl"), "v_mfma_f32_16x16x4_4b_bf16": (8, "xdl"),
    "v_mfma_f32_4x4x4_16b_bf16": (2, "xdl"), "v_mfma_f32_32x32x8_bf16": (8, "xdl"),
    "v_mfma_f32_16x16x16_bf16": (4, "xdl"),
    "v_mfma_i32_32x32x4_2b_i8": (16, "xdl"), "v_mfma_i32_16x16x4_4b_i8": (8, "xdl"),
    "v_mfma_i32_4x4x4_16b_i8": (2, "xdl"), "v_mfma_i32_32x32x16_i8": (8, "xdl"),
    "v_mfma_i32_16x16x32_i8": (4, "xdl"),
    "v_mfma_f32_32x32x4_xf32": (8, "xdl"), "v_mfma_f32_16x16x8_xf32": (4, "xdl"),
    "v_mfma_f32_16x16x32_fp8_fp8": (4, "xdl"), "v_mfma_f32_16x16x32_fp8_bf8": (4, "xdl"),
    "v_mfma_f32_16x16x32_bf8_fp8": (4, "xdl"), "v_mfma_f32_16x16x32_bf8_bf8": (4, "xdl"),
    "v_mfma_f32_32x32x16_fp8_fp8": (8, "xdl"), "v_mfma_f32_32x32x16_fp8_bf8": (8, "xdl"),
    "v_mfma_f32_32x32x16_bf8_fp8": (8, "xdl"), "v_mfma_f32_32x32x16_bf8_bf8": (8, "xdl"),
    # DGEMM
    "v_mfma_f64_16x16x4_f64": (8, "dgemm"), "v_mfma_f64_4x4x4_4b_f64": (4, "dgemm"),
}
_GFX950_EXTRA = {
    "v_mfma_scale_f32_16x16x128_f8f6f4": (8, "xdl"),
    "v_mfma_scale_f32_32x32x64_f8f6f4": (16, "xdl"),
}

TABLE: dict[str, dict[str, MfmaShape]] = {
    "gfx942": {m: MfmaShape(m, p, k, _LLVM) for m, (p, k) in _GFX942.items()},
    "gfx950": {**{m: MfmaShape(m, p, k, _LLVM) for m, (p, k) in _GFX942.items()},
               **{m: MfmaShape(m, p, k, _MI355_PR) for m, (p, k) in _GFX950_EXTRA.items()}},
}
# A listing that names no target is checked against the union (gfx950 is a superset here).
TABLE["any"] = TABLE["gfx950"]


def lookup(mnemonic: str, target: str = "any") -> MfmaShape | None:
    """The shape for an MFMA mnemonic (encoding suffixes such as `_e64` ignored)."""
    base = mnemonic.removesuffix("_e64").removesuffix("_vgprcd")
    return TABLE.get(target, TABLE["any"]).get(base)


def required_wait_states(shape: MfmaShape, reader: ReaderKind) -> int:
    """Wait states needed between `shape` writing its result and a reader of that result.

    `reader`: "valu" (VALU incl. v_accvgpr_read), "mem" (VMEM/LDS/export reading it as
    data or address), "srcab" (another MFMA's SrcA/B), "srcc_partial" / "srcc_full"
    (another MFMA's SrcC overlapping partly / exactly).
    """
    n = shape.passes
    if shape.kind == "dgemm":
        if reader in ("valu", "mem"):
            table = {4: (6, 9), 8: (11, 18), 16: (11, 18)}[n]
            return table[0] if reader == "valu" else table[1]
        return {"srcab": 11 if n >= 8 else 6, "srcc_partial": 9 if n >= 8 else 4,
                "srcc_full": 4 if n == 4 else 0}[reader]
    xdl = shape.kind == "xdl"
    if reader in ("valu", "mem", "srcab"):
        return n + 3 if xdl else n + 2
    if reader == "srcc_partial":
        return n + 1 if xdl else n
    return 2 if n == 2 else 0  # srcc_full: the hardware interlocks the accumulation chain


def retire_wait_states(shape: MfmaShape) -> int:
    """Wait states after which an MFMA has certainly finished reading its sources.

    The ISA exposes no counter for operand sampling (the MI355 megakernel PR: a 16x16x128
    MFMA streams its operands over its whole duration), so a load may overwrite a source
    register only once the op has retired: the same bound as a VALU read of its result.
    """
    return required_wait_states(shape, "valu")
