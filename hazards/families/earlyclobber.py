"""Family `earlyclobber`: a multi-load inline-asm block with non-early-clobber outputs.

The MI355 megakernel PR: four NT loads in one `asm volatile` with plain "=v"
outputs; the allocator put load 1's destination over load 2's address. Kernel:
`standalone/earlyclobber/earlyclobber.hip`, variants by -D parameters. The family is
static (AMD, checked on clang-19's gfx942 and clang-22's gfx950 output): on these machines
AMD code is compiled and checked, never run. NVIDIA cannot have this bug (PTX operands are virtual registers).
More in docs/families/earlyclobber.md.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hazards.engine import toolchain
from hazards.family import StaticVerdict, load_family
from hazards.kernel_sources import family_dir
from hazards.static import checks

SOURCE = family_dir("earlyclobber") / "earlyclobber.hip"
STATIC_ARCHS = toolchain.AMD_ARCHS  # the catalog judges every variant on each target's listing


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous iff one block holds >= 2 loads and its outputs are not early-clobber."""
    p = FAMILY.resolve(params)
    if p["split"]:
        return StaticVerdict(False, "one instruction per asm statement: outputs cannot alias")
    if p["early_clobber"]:
        return StaticVerdict(False, "\"=&v\": outputs are kept disjoint from every input")
    return StaticVerdict(True, f"{p['loads']} loads in one block with \"=v\" outputs: an "
                               "output may cover a later load's address")


def predicted_checks(params: dict[str, Any], arch: str = toolchain.GFX942) -> set[str]:
    """The check ids this point must trigger: the source lint and the overlap check on the
    emitted assembly (empty = clean), on every AMD target."""
    if not static_model(params).hazardous:
        return set()
    return {checks.EARLY_CLOBBER.id, checks.ASM_OVERLAP.id}


def strategy() -> Any:
    """Parameter points: a variant plus the load count and how addresses are passed."""
    return st.builds(
        lambda v, loads, base: {"variant": v, "loads": loads, "shared_base": base},
        st.sampled_from([v.name for v in FAMILY.variants]), st.integers(2, 4), st.booleans())


def static_check(params: dict[str, Any], arch: str = toolchain.GFX942):
    """Findings for one point from real compiler output: lint of the preprocessed source
    (allowlist ignored) plus the AMDGCN checks on the assembly clang emits for `arch`."""
    from hazards.static import amdgcn, asm_lint, cscan
    from hazards.static.compile import preprocess

    d = FAMILY.defines(params)
    label = FAMILY.build_label(params)
    pre = preprocess(SOURCE, defines=d, label=label + "-pp")
    found = asm_lint.lint_text(pre.text, str(SOURCE), honor_allowlist=False,
                               line_map=cscan.line_map(pre.text))
    return found + amdgcn.compile_and_check(SOURCE, arch=arch, defines=d, label=f"{label}-{arch}")


# Parameters (-D of the point build), variants and their reasons: standalone/earlyclobber/family.toml.
FAMILY = load_family("earlyclobber", static_model=static_model, strategy=strategy,
                     static_check=static_check, predicted_checks=predicted_checks, static_archs=STATIC_ARCHS)
