"""The MFMA wait-state table agrees with LLVM's hazard recognizer in clang-19 (gfx942).

One kernel per table row: an MFMA intrinsic whose result is used right away. LLVM inserts
exactly the `s_nop`s its recognizer requires; the fewest wait states on any path from the
MFMA to the first reader of its result must equal `required_wait_states` for that reader.
"""
from __future__ import annotations

import pytest

from hazards.static import amdgcn, amdgcn_isa as isa, mfma_table
from hazards.static.compile import compile_amdgcn
from static_helpers import requires_clang

V = "__attribute__((ext_vector_type({n})))"
TYPES = ["typedef float v2f " + V.format(n=2) + ";", "typedef _Float16 v4h " + V.format(n=4) + ";",
         "typedef short v4s " + V.format(n=4) + ";"]
for n in (4, 16, 32):
    TYPES += [f"typedef float f{n} {V.format(n=n)};", f"typedef int i{n} {V.format(n=n)};"]
TYPES.append(f"typedef double d4 {V.format(n=4)};")

# mnemonic -> (builtin, A/B type, C type)
ROWS = {
    "v_mfma_f32_32x32x1_2b_f32": ("mfma_f32_32x32x1f32", "float", "f32"),
    "v_mfma_f32_16x16x1_4b_f32": ("mfma_f32_16x16x1f32", "float", "f16"),
    "v_mfma_f32_4x4x1_16b_f32": ("mfma_f32_4x4x1f32", "float", "f4"),
    "v_mfma_f32_32x32x2_f32": ("mfma_f32_32x32x2f32", "float", "f16"),
    "v_mfma_f32_16x16x4_f32": ("mfma_f32_16x16x4f32", "float", "f4"),
    "v_mfma_f32_32x32x4_2b_f16": ("mfma_f32_32x32x4f16", "v4h", "f32"),
    "v_mfma_f32_16x16x4_4b_f16": ("mfma_f32_16x16x4f16", "v4h", "f16"),
    "v_mfma_f32_4x4x4_16b_f16": ("mfma_f32_4x4x4f16", "v4h", "f4"),
    "v_mfma_f32_32x32x8_f16": ("mfma_f32_32x32x8f16", "v4h", "f16"),
    "v_mfma_f32_16x16x16_f16": ("mfma_f32_16x16x16f16", "v4h", "f4"),
    "v_mfma_f32_32x32x4_2b_bf16": ("mfma_f32_32x32x4bf16_1k", "v4s", "f32"),
    "v_mfma_f32_16x16x4_4b_bf16": ("mfma_f32_16x16x4bf16_1k", "v4s", "f16"),
    "v_mfma_f32_4x4x4_16b_bf16": ("mfma_f32_4x4x4bf16_1k", "v4s", "f4"),
    "v_mfma_f32_32x32x8_bf16": ("mfma_f32_32x32x8bf16_1k", "v4s", "f16"),
    "v_mfma_f32_16x16x16_bf16": ("mfma_f32_16x16x16bf16_1k", "v4s", "f4"),
    "v_mfma_i32_32x32x4_2b_i8": ("mfma_i32_32x32x4i8", "int", "i32"),
    "v_mfma_i32_16x16x4_4b_i8": ("mfma_i32_16x16x4i8", "int", "i16"),
    "v_mfma_i32_4x4x4_16b_i8": ("mfma_i32_4x4x4i8", "int", "i4"),
    "v_mfma_i32_32x32x16_i8": ("mfma_i32_32x32x16_i8", "long", "i16"),
    "v_mfma_i32_16x16x32_i8": ("mfma_i32_16x16x32_i8", "long", "i4"),
    "v_mfma_f32_32x32x4_xf32": ("mfma_f32_32x32x4_xf32", "v2f", "f16"),
    "v_mfma_f32_16x16x8_xf32": ("mfma_f32_16x16x8_xf32", "v2f", "f4"),
    "v_mfma_f32_16x16x32_fp8_fp8": ("mfma_f32_16x16x32_fp8_fp8", "long", "f4"),
    "v_mfma_f32_16x16x32_fp8_bf8": ("mfma_f32_16x16x32_fp8_bf8", "long", "f4"),
    "v_mfma_f32_16x16x32_bf8_fp8": ("mfma_f32_16x16x32_bf8_fp8", "long", "f4"),
    "v_mfma_f32_16x16x32_bf8_bf8": ("mfma_f32_16x16x32_bf8_bf8", "long", "f4"),
    "v_mfma_f32_32x32x16_fp8_fp8": ("mfma_f32_32x32x16_fp8_fp8", "long", "f16"),
    "v_mfma_f32_32x32x16_fp8_bf8": ("mfma_f32_32x32x16_fp8_bf8", "long", "f16"),
    "v_mfma_f32_32x32x16_bf8_fp8": ("mfma_f32_32x32x16_bf8_fp8", "long", "f16"),
    "v_mfma_f32_32x32x16_bf8_bf8": ("mfma_f32_32x32x16_bf8_bf8", "long", "f16"),
    "v_mfma_f64_16x16x4_f64": ("mfma_f64_16x16x4f64", "double", "d4"),
    "v_mfma_f64_4x4x4_4b_f64": ("mfma_f64_4x4x4f64", "double", "double"),
}


def test_every_gfx942_row_has_a_probe():
    assert set(ROWS) == set(mfma_table.TABLE["gfx942"])


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    src = ["#define __global__ __attribute__((global))", *TYPES]
    for k, (mnem, (builtin, ab, c)) in enumerate(ROWS.items()):
        use = "c" if c == "double" else "c[0]"
        src.append(f"__global__ void probe{k}(const {ab}* a, const {ab}* b, const {c}* cp, float* o)"
                   f" {{ {c} c = cp[0]; c = __builtin_amdgcn_{builtin}(a[0], b[0], c, 0, 0, 0);"
                   f" o[0] = (float)({use}); }}")
    path = tmp_path_factory.mktemp("mfma") / "probes.hip"
    path.write_text("\n".join(src) + "\n")
    build = compile_amdgcn(path, label="mfma-probes")
    return isa.parse_listing(build.text)


@requires_clang
def test_llvm_inserts_exactly_the_table_wait_states_for_every_gfx942_mfma(probes):
    checked, exact = 0, 0
    for func in probes:
        (m_idx,) = [i for i, ins in enumerate(func.instrs) if ins.is_mfma]
        mfma = func.instrs[m_idx]
        shape = mfma_table.lookup(mfma.mnemonic, "gfx942")
        assert shape is not None, mfma.mnemonic
        dst = isa.units(mfma.writes())
        reach = isa.min_wait_reach(func, m_idx, 64, lambda i: bool(isa.units(func.instrs[i].reads()) & dst))
        readers = [(w, i) for i, w in reach.items() if isa.units(func.instrs[i].reads()) & dst]
        waited, r_idx = min(readers)
        kind = amdgcn._reader_kind(func.instrs[r_idx], dst)
        need = mfma_table.required_wait_states(shape, kind)
        nops = any(func.instrs[i].mnemonic == "s_nop" for i in range(m_idx + 1, r_idx))
        # padding placed for another hazard (a VALU overwriting part of the result, WAW)
        # says nothing about the read: exactness is claimed only when the read comes first
        waw = any(isa.units(func.instrs[i].writes()) & dst for i in range(m_idx + 1, r_idx))
        assert waited >= need, (mfma.mnemonic, kind, waited, need)  # table never stricter
        if nops and not waw:  # LLVM had to pad: the padding is exactly our requirement
            assert waited == need, (mfma.mnemonic, kind, waited, need)
            exact += 1
        checked += 1
    assert checked == len(ROWS) and exact >= len(ROWS) - 4


@requires_clang
def test_clang_output_has_no_mfma_findings(probes):
    for func in probes:
        assert not [f for f in amdgcn.check_mfma_waits([func], "p.s", "gfx942") if f.fails]


def test_required_wait_states_follow_llvm_formulas():
    s = mfma_table.lookup("v_mfma_f32_32x32x8_f16", "gfx942")
    assert (s.passes, s.kind) == (8, "xdl")
    assert mfma_table.required_wait_states(s, "valu") == 11  # GFX940_XDL_N_Pass...: N + 3
    assert mfma_table.required_wait_states(s, "srcc_full") == 0
    f32 = mfma_table.lookup("v_mfma_f32_32x32x2_f32", "gfx942")
    assert mfma_table.required_wait_states(f32, "valu") == 18  # SMFMA: N + 2



# gfx950, from ROCm/llvm-project's recognizer (IsGFX950 rules) and scheduling model, cited in
# hazards/static/mfma_table.py: (passes, VALU read, SrcA/B, partial SrcC)
GFX950_RULES = {
    "v_mfma_f32_16x16x32_bf16": (4, 8, 7, 6), "v_mfma_f32_16x16x32_f16": (4, 8, 7, 6),
    "v_mfma_f32_32x32x16_bf16": (8, 12, 11, 10), "v_mfma_f32_32x32x16_f16": (8, 12, 11, 10),
    "v_mfma_i32_16x16x64_i8": (4, 8, 7, 6), "v_mfma_i32_32x32x32_i8": (8, 12, 11, 10),
    "v_mfma_f32_16x16x128_f8f6f4": (8, 12, 11, 10), "v_mfma_f32_32x32x64_f8f6f4": (16, 20, 19, 18),
    "v_mfma_scale_f32_16x16x128_f8f6f4": (8, 12, 11, 10),
    "v_mfma_scale_f32_32x32x64_f8f6f4": (16, 20, 19, 18),
    "v_mfma_f32_4x4x4_16b_f16": (2, 5, 5, 4),  # 2-pass XDL: no gfx950 extra on VALU reads
    "v_mfma_f32_32x32x2_f32": (16, 18, 18, 16),  # SMFMA: unchanged from gfx940
    "v_mfma_f64_16x16x4_f64": (16, 19, 19, 17),  # the 16x16 DGEMM: 16 passes on gfx950
}


@pytest.mark.parametrize("mnemonic", sorted(GFX950_RULES))
def test_gfx950_rows_follow_the_cited_llvm_rules(mnemonic):
    shape = mfma_table.lookup(mnemonic, "gfx950")
    got = (shape.passes, *(mfma_table.required_wait_states(shape, k) for k in ("valu", "srcab", "srcc_partial")))
    assert got == GFX950_RULES[mnemonic]


def test_an_f8f6f4_op_with_no_f8_matrix_takes_half_the_passes():
    f8 = mfma_table.lookup("v_mfma_scale_f32_16x16x128_f8f6f4", "gfx950", "... cbsz:0 blgp:4")
    f4 = mfma_table.lookup("v_mfma_scale_f32_16x16x128_f8f6f4", "gfx950", "... cbsz:4 blgp:4")
    assert (f8.passes, f4.passes) == (8, 4)


def test_gfx942_listings_keep_the_gfx940_rules_for_shared_mnemonics():
    shared = "v_mfma_f32_32x32x8_f16"
    assert mfma_table.required_wait_states(mfma_table.lookup(shared), "valu") == 11
    assert mfma_table.required_wait_states(mfma_table.lookup(shared, "gfx950"), "valu") == 12
