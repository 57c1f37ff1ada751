"""Family `earlyclobber`: a multi-load inline-asm block with non-early-clobber outputs.

The MI355 megakernel PR: four NT loads in one `asm volatile` with plain "=v"
outputs; the allocator put load 1's destination over load 2's address. Kernel:
`standalone/earlyclobber/earlyclobber.hip`, variants by -D parameters. The family is
static (AMD, checked on clang-19's gfx942 output): on these machines AMD code is compiled
and checked, never run. NVIDIA cannot have this bug (PTX operands are virtual registers).

Oracles: the source lint (on the variant's preprocessed text) and the AMDGCN overlap
check (`asm-overlap`) on the emitted assembly, which sees the registers the allocator really chose.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hazards.family import STANDALONE, Family, StaticVerdict, Variant
from hazards.presets import Points
from hazards.static import checks

SOURCE = STANDALONE / "earlyclobber" / "earlyclobber.hip"
DEFAULTS: dict[str, Any] = {"early_clobber": False, "split": False, "loads": 4,
                            "shared_base": False}
DEFINE_NAMES = {"early_clobber": "HZ_EARLY_CLOBBER", "split": "HZ_SPLIT", "loads": "HZ_LOADS",
                "shared_base": "HZ_SHARED_BASE"}

VARIANTS = (
    Variant("reference", "reference", "one load per asm statement: nothing to alias",
            params={"split": True}),
    Variant("fixed", "fixed", "the MI355 PR's four loads in one block with \"=&v\" outputs",
            params={"early_clobber": True}),
    Variant("broken", "broken", "the MI355 PR's four loads in one block with \"=v\" outputs",
            params={"early_clobber": False}, detected_by=("static",)),
    Variant("broken_shared_base", "broken",
            "one base address and offset: immediates, \"=v\" outputs (load 1 covers the base)",
            params={"early_clobber": False, "shared_base": True}, detected_by=("static",)),
)
POINTS = Points(DEFAULTS, VARIANTS, DEFINE_NAMES)
resolve = POINTS.resolve
defines = POINTS.defines


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous iff one block holds >= 2 loads and its outputs are not early-clobber."""
    p = resolve(params)
    if p["split"]:
        return StaticVerdict(False, "one instruction per asm statement: outputs cannot alias")
    if p["loads"] < 2:
        return StaticVerdict(False, "a single load reads its address before writing")
    if p["early_clobber"]:
        return StaticVerdict(False, "\"=&v\": outputs are kept disjoint from every input")
    return StaticVerdict(True, f"{p['loads']} loads in one block with \"=v\" outputs: an "
                               "output may cover a later load's address")


def predicted_checks(params: dict[str, Any]) -> set[str]:
    """The check ids this point must trigger: the source lint and the overlap check on the
    emitted assembly (empty = clean)."""
    if not static_model(params).hazardous:
        return set()
    return {checks.EARLY_CLOBBER.id, checks.ASM_OVERLAP.id}


def strategy() -> Any:
    """Parameter points: a variant plus the load count and how addresses are passed."""
    return st.builds(
        lambda v, loads, base: {"variant": v, "loads": loads, "shared_base": base},
        st.sampled_from([v.name for v in VARIANTS]), st.integers(2, 4), st.booleans())


def static_check(params: dict[str, Any]):
    """Findings for one point from real compiler output: lint of the preprocessed source
    (allowlist ignored) plus the AMDGCN checks on clang-19's gfx942 assembly."""
    from hazards.static import amdgcn, asm_lint, cscan
    from hazards.static.compile import preprocess

    d = defines(params)
    label = POINTS.label("earlyclobber", params)
    pre = preprocess(SOURCE, defines=d, label=label + "-pp")
    found = asm_lint.lint_text(pre.text, str(SOURCE), honor_allowlist=False,
                               line_map=cscan.line_map(pre.text))
    return found + amdgcn.compile_and_check(SOURCE, defines=d, label=label)


FAMILY = Family(
    name="earlyclobber",
    summary="multi-load inline asm with non-early-clobber outputs: an output covers a later "
            "load's address (AMD, static)",
    variants=VARIANTS,
    static_model=static_model,
    strategy=strategy,
    source_dir="earlyclobber",
    binary=None,
    platforms=("amd",),
)
