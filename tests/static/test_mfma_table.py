"""The MFMA wait-state table agrees with LLVM's hazard recognizer: in clang-19 for gfx942,
in clang-22 for gfx950 (clang-19 rejects gfx950).

One kernel per table row: an MFMA intrinsic whose result is used right away. LLVM inserts
exactly the `s_nop`s its recognizer requires; the fewest wait states on any path from the
MFMA to the first reader of its result must equal `required_wait_states` for that reader.
"""
from __future__ import annotations

import subprocess

import pytest

from hazards.engine import toolchain
from hazards.engine.errors import ToolchainMissing
from hazards.static import amdgcn, amdgcn_isa as isa, mfma_table
from hazards.static.compile import compile_amdgcn
from static_helpers import requires_clang

V = "__attribute__((ext_vector_type({n})))"
TYPES = ["typedef float v2f " + V.format(n=2) + ";", "typedef _Float16 v4h " + V.format(n=4) + ";",
         "typedef short v4s " + V.format(n=4) + ";", "typedef _Float16 v8h " + V.format(n=8) + ";",
         "typedef __bf16 v8bf " + V.format(n=8) + ";", "typedef int i8 " + V.format(n=8) + ";"]
for n in (4, 16, 32):
    TYPES += [f"typedef float f{n} {V.format(n=n)};", f"typedef int i{n} {V.format(n=n)};"]
TYPES.append(f"typedef double d4 {V.format(n=4)};")

# One table for both targets: mnemonic -> (targets, builtin, A/B type, C type[, call]).
# The f8f6f4 ops (gfx950) come from the scaled builtin (LLVM selects the unscaled instruction
# when both scales are the constant 0); cbsz/blgp 4 = f4 operands (half the passes). The xf32
# ops are gone on gfx950 (test_the_dropped_xf32_ops_are_not_gfx950_instructions).
_F8F6F4 = "(a[0], b[0], c, {fmt}, {fmt}, 0, {sa}, 0, {sb})"
BOTH, GFX942, GFX950 = ("gfx942", "gfx950"), ("gfx942",), ("gfx950",)
ROWS = {
    "v_mfma_f32_32x32x1_2b_f32": (BOTH, "mfma_f32_32x32x1f32", "float", "f32"),
    "v_mfma_f32_16x16x1_4b_f32": (BOTH, "mfma_f32_16x16x1f32", "float", "f16"),
    "v_mfma_f32_4x4x1_16b_f32": (BOTH, "mfma_f32_4x4x1f32", "float", "f4"),
    "v_mfma_f32_32x32x2_f32": (BOTH, "mfma_f32_32x32x2f32", "float", "f16"),
    "v_mfma_f32_16x16x4_f32": (BOTH, "mfma_f32_16x16x4f32", "float", "f4"),
    "v_mfma_f32_32x32x4_2b_f16": (BOTH, "mfma_f32_32x32x4f16", "v4h", "f32"),
    "v_mfma_f32_16x16x4_4b_f16": (BOTH, "mfma_f32_16x16x4f16", "v4h", "f16"),
    "v_mfma_f32_4x4x4_16b_f16": (BOTH, "mfma_f32_4x4x4f16", "v4h", "f4"),
    "v_mfma_f32_32x32x8_f16": (BOTH, "mfma_f32_32x32x8f16", "v4h", "f16"),
    "v_mfma_f32_16x16x16_f16": (BOTH, "mfma_f32_16x16x16f16", "v4h", "f4"),
    "v_mfma_f32_32x32x4_2b_bf16": (BOTH, "mfma_f32_32x32x4bf16_1k", "v4s", "f32"),
    "v_mfma_f32_16x16x4_4b_bf16": (BOTH, "mfma_f32_16x16x4bf16_1k", "v4s", "f16"),
    "v_mfma_f32_4x4x4_16b_bf16": (BOTH, "mfma_f32_4x4x4bf16_1k", "v4s", "f4"),
    "v_mfma_f32_32x32x8_bf16": (BOTH, "mfma_f32_32x32x8bf16_1k", "v4s", "f16"),
    "v_mfma_f32_16x16x16_bf16": (BOTH, "mfma_f32_16x16x16bf16_1k", "v4s", "f4"),
    "v_mfma_i32_32x32x4_2b_i8": (BOTH, "mfma_i32_32x32x4i8", "int", "i32"),
    "v_mfma_i32_16x16x4_4b_i8": (BOTH, "mfma_i32_16x16x4i8", "int", "i16"),
    "v_mfma_i32_4x4x4_16b_i8": (BOTH, "mfma_i32_4x4x4i8", "int", "i4"),
    "v_mfma_i32_32x32x16_i8": (BOTH, "mfma_i32_32x32x16_i8", "long", "i16"),
    "v_mfma_i32_16x16x32_i8": (BOTH, "mfma_i32_16x16x32_i8", "long", "i4"),
    "v_mfma_f32_32x32x4_xf32": (GFX942, "mfma_f32_32x32x4_xf32", "v2f", "f16"),
    "v_mfma_f32_16x16x8_xf32": (GFX942, "mfma_f32_16x16x8_xf32", "v2f", "f4"),
    "v_mfma_f32_16x16x32_fp8_fp8": (BOTH, "mfma_f32_16x16x32_fp8_fp8", "long", "f4"),
    "v_mfma_f32_16x16x32_fp8_bf8": (BOTH, "mfma_f32_16x16x32_fp8_bf8", "long", "f4"),
    "v_mfma_f32_16x16x32_bf8_fp8": (BOTH, "mfma_f32_16x16x32_bf8_fp8", "long", "f4"),
    "v_mfma_f32_16x16x32_bf8_bf8": (BOTH, "mfma_f32_16x16x32_bf8_bf8", "long", "f4"),
    "v_mfma_f32_32x32x16_fp8_fp8": (BOTH, "mfma_f32_32x32x16_fp8_fp8", "long", "f16"),
    "v_mfma_f32_32x32x16_fp8_bf8": (BOTH, "mfma_f32_32x32x16_fp8_bf8", "long", "f16"),
    "v_mfma_f32_32x32x16_bf8_fp8": (BOTH, "mfma_f32_32x32x16_bf8_fp8", "long", "f16"),
    "v_mfma_f32_32x32x16_bf8_bf8": (BOTH, "mfma_f32_32x32x16_bf8_bf8", "long", "f16"),
    "v_mfma_f64_16x16x4_f64": (BOTH, "mfma_f64_16x16x4f64", "double", "d4"),
    "v_mfma_f64_4x4x4_4b_f64": (BOTH, "mfma_f64_4x4x4f64", "double", "double"),
    "v_mfma_f32_16x16x32_f16": (GFX950, "mfma_f32_16x16x32_f16", "v8h", "f4"),
    "v_mfma_f32_16x16x32_bf16": (GFX950, "mfma_f32_16x16x32_bf16", "v8bf", "f4"),
    "v_mfma_f32_32x32x16_f16": (GFX950, "mfma_f32_32x32x16_f16", "v8h", "f16"),
    "v_mfma_f32_32x32x16_bf16": (GFX950, "mfma_f32_32x32x16_bf16", "v8bf", "f16"),
    "v_mfma_i32_16x16x64_i8": (GFX950, "mfma_i32_16x16x64_i8", "i4", "i4"),
    "v_mfma_i32_32x32x32_i8": (GFX950, "mfma_i32_32x32x32_i8", "i4", "i16"),
    "v_mfma_f32_16x16x128_f8f6f4": (GFX950, "mfma_scale_f32_16x16x128_f8f6f4", "i8", "f4",
                                    _F8F6F4.format(fmt=0, sa=0, sb=0)),
    "v_mfma_f32_32x32x64_f8f6f4": (GFX950, "mfma_scale_f32_32x32x64_f8f6f4", "i8", "f16",
                                   _F8F6F4.format(fmt=0, sa=0, sb=0)),
    "v_mfma_scale_f32_16x16x128_f8f6f4": (GFX950, "mfma_scale_f32_16x16x128_f8f6f4", "i8", "f4",
                                          _F8F6F4.format(fmt=0, sa="s[0]", sb="s[1]")),
    "v_mfma_scale_f32_32x32x64_f8f6f4": (GFX950, "mfma_scale_f32_32x32x64_f8f6f4", "i8", "f16",
                                         _F8F6F4.format(fmt=0, sa="s[0]", sb="s[1]")),
}
# the same op with f4 operands only (cbsz:4 blgp:4): a probe of its own, one row of the table
F4_PROBE = ("mfma_scale_f32_16x16x128_f8f6f4", "i8", "f4", _F8F6F4.format(fmt=4, sa="s[0]", sb="s[1]"))


def _rows_of(arch: str) -> dict[str, tuple]:
    """The table's rows for `arch`: mnemonic -> (builtin, A/B type, C type[, call])."""
    return {m: r[1:] for m, r in ROWS.items() if arch in r[0]}


def _probes_for(arch: str) -> list[tuple]:
    return [*_rows_of(arch).values(), *([F4_PROBE] if arch == "gfx950" else [])]


@pytest.mark.parametrize("arch", toolchain.AMD_ARCHS)
def test_every_row_of_each_target_has_a_probe(arch):
    assert set(_rows_of(arch)) == set(mfma_table.TABLE[arch])


def _compile_probes(arch: str, folder) -> list:
    src = ["#define __global__ __attribute__((global))", *TYPES]
    for k, (builtin, ab, c, *args) in enumerate(_probes_for(arch)):
        use = "c" if c == "double" else "c[0]"
        call = args[0] if args else "(a[0], b[0], c, 0, 0, 0)"
        src.append(f"__global__ void probe{k}(const {ab}* a, const {ab}* b, const {c}* cp, const int* s,"
                   f" float* o) {{ {c} c = cp[0]; c = __builtin_amdgcn_{builtin}{call};"
                   f" o[0] = (float)({use}); }}")
    path = folder / f"probes-{arch}.hip"
    path.write_text("\n".join(src) + "\n")
    try:
        build = compile_amdgcn(path, arch=arch, label=f"mfma-probes-{arch}")
    except ToolchainMissing as e:
        pytest.skip(f"no clang for {arch}: {e}")
    return isa.parse_listing(build.text)


@pytest.fixture(scope="module", params=toolchain.AMD_ARCHS)
def probes(request, tmp_path_factory):
    return request.param, _compile_probes(request.param, tmp_path_factory.mktemp("mfma"))


@requires_clang
def test_llvm_inserts_exactly_the_table_wait_states_for_every_mfma(probes):
    arch, funcs = probes
    checked, exact, seen = 0, 0, set()
    for func in funcs:
        (m_idx,) = [i for i, ins in enumerate(func.instrs) if ins.is_mfma]
        mfma = func.instrs[m_idx]
        shape = mfma_table.lookup(mfma.mnemonic, arch, mfma.text)
        assert shape is not None, mfma.mnemonic
        seen.add(mfma.mnemonic.removesuffix("_e64"))
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
        assert waited >= need, (arch, mfma.mnemonic, kind, waited, need)  # table never stricter
        if nops and not waw:  # LLVM had to pad: the padding is exactly our requirement
            assert waited == need, (arch, mfma.mnemonic, kind, waited, need)
            exact += 1
        checked += 1
    # every row of the target came out of the compiler as itself (no other selection)
    assert seen == set(mfma_table.TABLE[arch]), sorted(seen ^ set(mfma_table.TABLE[arch]))
    assert checked == len(_probes_for(arch)) and exact >= checked - 4


@requires_clang
def test_clang_output_has_no_mfma_findings(probes):
    arch, funcs = probes
    for func in funcs:
        assert not [f for f in amdgcn.check_mfma_waits([func], "p.s", arch) if f.fails]


@requires_clang
def test_the_dropped_xf32_ops_are_not_gfx950_instructions(tmp_path):
    src = tmp_path / "xf32.hip"
    src.write_text("#define __global__ __attribute__((global))\n" + TYPES[0] + "\n" + TYPES[6] + "\n"
                   "__global__ void k(const v2f* a, const f4* c, float* o) {"
                   " o[0] = __builtin_amdgcn_mfma_f32_16x16x8_xf32(a[0], a[1], c[0], 0, 0, 0)[0]; }\n")
    try:
        clang = toolchain.find_tool("clang", arch="gfx950")
    except ToolchainMissing as e:
        pytest.skip(f"no clang for gfx950: {e}")
    # (no crash reproducer files: the backend aborts on the unselectable intrinsic)
    proc = subprocess.run([clang, *toolchain.AMD_DEVICE_ONLY_FLAGS, "--offload-arch=gfx950", "-O3", "-S",
                           "-fno-crash-diagnostics", str(src), "-o", str(tmp_path / "xf32.s")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Cannot select: intrinsic %llvm.amdgcn.mfma.f32.16x16x8.xf32" in proc.stderr


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
