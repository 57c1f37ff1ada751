"""MFMA pass counts and the wait states a dependent instruction needs, per target.

Sources (cited; no code is copied, the numbers are restated as formulas):

- The rules are LLVM's AMDGPU hazard recognizer, `llvm/lib/Target/AMDGPU/
  GCNHazardRecognizer.cpp`, gfx940 branch (gfx940/941/942 = MI300, CDNA3):
  * `GFX940_XDL_N_PassWriteVgprVALUMemExpReadWaitStates`   = passes + 3  (XDL result read by
    a VALU - v_accvgpr_read included -, a memory op or an export)
  * `GFX940_SMFMA_N_PassWriteVgprVALUMemExpReadWaitStates` = passes + 2  (non-XDL: the f32 MFMAs)
  * `GFX940_XDL_N_PassWritesVGPROverlappedSrcABWaitStates` = passes + 3, SMFMA passes + 2
    (a later MFMA reads the result as SrcA/SrcB)
  * `GFX940_XDL_N_PassWritesVGPROverlapped...SrcCWaitStates` = passes + 1, SMFMA passes
    (partially overlapping SrcC); exactly the same registers as SrcC: 0 (the hardware
    interlocks an accumulation chain), except 2-pass MFMAs which need 2
    (`GFX940_SMFMA4x4WritesVGPRFullSrcCWaitStates`)
  * DGEMM (f64): `DMFMA4x4WriteVgprVALUReadWaitStates` 6 / `...MemExpReadWaitStates` 9,
    `DMFMA16x16WriteVgprVALUReadWaitStates` 11 / `...MemExpReadWaitStates` 18.
- gfx950 (MI350/MI355, CDNA4), from ROCm/llvm-project's recognizer at commit
  11c27ae7a95456bb196c56c461d9b7cca586bc4d (the `IsGFX950` arguments):
  * an XDL result read by a VALU/memory op/export: passes + 3, plus 1 unless the op has 2
    passes (5, 8, 12, 20 for 2/4/8/16 passes);
  * an XDL result read as partially overlapping SrcC by another XDL: passes + 2;
  * SrcA/SrcB, and every SMFMA rule: as on gfx940;
  * the 16x16 DGEMM: VALU read 19, SrcA/B 19, overlapping SrcC 17.
  The pass counts are the gfx950 scheduling model, `llvm/lib/Target/AMDGPU/SISchedule.td`
  (`SIDPGFX950FullSpeedModel`) at ROCm/llvm-project commit
  37d9a3454da7fdf91f3f45e47d64d28fefeed9fb: 16x16x{16,32,64} 4 passes, 32x32x{8,16,32} 8,
  the 16x16 f64 op 16, and the f8f6f4 ops 8 (16x16x128) / 16 (32x32x64) when either matrix
  is an f8 format (`cbsz`/`blgp` 0 or 1, the default) and half that for f6/f4 only.
- Both tables are read back from real compiler output: tests/static/test_mfma_table.py
  compiles one kernel per intrinsic - for gfx942 with clang-19, for gfx950 with clang-22
  (clang-19 rejects the processor) - and asserts that the wait states LLVM inserted before
  the first read of each result equal `required_wait_states(...)`, for every row of the
  target (the gfx950 rows verified so: 16x16x32/32x32x16 f16/bf16, the i8 ops, the f8f6f4
  and scaled f8f6f4 ops with f8 and f4 operands, the 16-pass f64 op). clang-22 also showed
  the two xf32 ops are not gfx950 instructions (`gfx950_dropped`).
- The MI355 megakernel PR measured 11 wait states as enough before `v_accvgpr_read_b32` of
  an 8-pass `v_mfma_scale_f32_16x16x128_f8f6f4` (10 fails 300/300, 11 passes 300/300) and
  saw its LLVM emit `s_nop 7; s_nop 2` (11); the recognizer above asks 12. The table follows
  LLVM (one more than that measurement): the PR's broken 9 and fixed 32 are judged alike.

One wait state is one issue slot; `s_nop N` provides N+1. The MI355 megakernel PR calls
them clocks.
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Literal

ReaderKind = Literal["valu", "mem", "srcab", "srcc_partial", "srcc_full"]


@dataclasses.dataclass(frozen=True)
class MfmaShape:
    """One MFMA instruction on one target: how many passes it takes and its pipeline class."""

    mnemonic: str
    passes: int
    kind: Literal["xdl", "smfma", "dgemm"]
    source: str
    target: str = "gfx942"

    @property
    def cycles(self) -> int:
        """Cycles the op occupies the matrix pipe (4 per pass)."""
        return 4 * self.passes


_LLVM_942 = "LLVM GCNHazardRecognizer gfx940 rules + SISchedule pass count (checked vs clang-19)"
_LLVM_950 = ("ROCm/llvm-project GCNHazardRecognizer.cpp @ 11c27ae7 (IsGFX950 rules) + "
             "SISchedule.td @ 37d9a345 (SIDPGFX950FullSpeedModel), checked vs clang-22")

# The pass counts are data (mfma_shapes.toml): gfx950 has the gfx942 shapes but two, plus its own.
_SHAPES = tomllib.loads((Path(__file__).with_name("mfma_shapes.toml")).read_text())
_GFX942 = {m: (passes, kind) for m, (passes, kind) in _SHAPES["gfx942"].items()}
_GFX950 = {**{m: v for m, v in _GFX942.items() if m not in _SHAPES["gfx950_dropped"]["mnemonics"]},
           **{m: (passes, kind) for m, (passes, kind) in _SHAPES["gfx950"].items()}}
_FORMAT_DEPENDENT = re.compile(r"_f8f6f4$")

TABLE: dict[str, dict[str, MfmaShape]] = {
    "gfx942": {m: MfmaShape(m, p, k, _LLVM_942, "gfx942") for m, (p, k) in _GFX942.items()},
    "gfx950": {m: MfmaShape(m, p, k, _LLVM_950, "gfx950") for m, (p, k) in _GFX950.items()},
}
# A listing that names no target: the gfx942 rules for shared mnemonics, gfx950's for the
# ones only gfx950 has (inline asm for gfx950 compiled by a clang that targets gfx942).
TABLE["any"] = {**TABLE["gfx950"], **TABLE["gfx942"]}


def lookup(mnemonic: str, target: str = "any", text: str = "") -> MfmaShape | None:
    """The shape for an MFMA mnemonic (encoding suffixes such as `_e64` ignored); `text`, the
    instruction as written, gives an f8f6f4 op its operand formats (`cbsz:`/`blgp:`)."""
    base = mnemonic.removesuffix("_e64").removesuffix("_vgprcd")
    shape = TABLE.get(target, TABLE["any"]).get(base)
    if shape is None or not _FORMAT_DEPENDENT.search(base):
        return shape
    fmt = {k: int(v) for k, v in re.findall(r"\b(cbsz|blgp):(\d+)", text)}
    if min(fmt.get("cbsz", 0), fmt.get("blgp", 0)) <= 1:  # an f8 matrix: the full count
        return shape
    return dataclasses.replace(shape, passes=shape.passes // 2)


def required_wait_states(shape: MfmaShape, reader: ReaderKind) -> int:
    """Wait states needed between `shape` writing its result and a reader of that result.

    `reader`: "valu" (VALU incl. v_accvgpr_read), "mem" (VMEM/LDS/export reading it as
    data or address), "srcab" (another MFMA's SrcA/B), "srcc_partial" / "srcc_full"
    (another MFMA's SrcC overlapping partly / exactly).
    """
    n, gfx950 = shape.passes, shape.target == "gfx950"
    if shape.kind == "dgemm":
        if n == 16:  # the 16x16 f64 op on gfx950
            return {"valu": 19, "mem": 18, "srcab": 19, "srcc_partial": 17, "srcc_full": 0}[reader]
        if reader in ("valu", "mem"):
            table = {4: (6, 9), 8: (11, 18)}[n]
            return table[0] if reader == "valu" else table[1]
        return {"srcab": 11 if n >= 8 else 6, "srcc_partial": 9 if n >= 8 else 4,
                "srcc_full": 4 if n == 4 else 0}[reader]
    xdl = shape.kind == "xdl"
    if reader in ("valu", "mem"):
        return n + 3 + (gfx950 and n != 2) if xdl else n + 2
    if reader == "srcab":
        return n + 3 if xdl else n + 2
    if reader == "srcc_partial":
        return n + 1 + gfx950 if xdl else n
    return 2 if n == 2 else 0  # srcc_full: the hardware interlocks the accumulation chain


def retire_wait_states(shape: MfmaShape) -> int:
    """Wait states after which an MFMA has certainly finished reading its sources.

    The ISA exposes no counter for operand sampling (the MI355 megakernel PR: a 16x16x128
    MFMA streams its operands over its whole duration), so a load may overwrite a source
    register only once the op has retired: the same bound as a VALU read of its result.
    """
    return required_wait_states(shape, "valu")
