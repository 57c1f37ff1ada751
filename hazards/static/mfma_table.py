"""MFMA pass counts and the wait states a dependent instruction needs, per target.

The numbers restate LLVM's AMDGPU hazard recognizer and scheduling model as formulas (no
code copied) and are read back from real compiler output; sources and commits are in
docs/static-checks.md."""
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
