"""The AMDGCN checks on minimal listings and on clang-19's real output."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from hazards.families import earlyclobber
from hazards.static import amdgcn, amdgcn_isa as isa
from hazards.static.compile import compile_amdgcn
from hazards.strategies.static import AsmBlockSpec, block_hazard
from static_helpers import DATA, failing_ids, listing, requires_clang


def check(body: str):
    return amdgcn.check_listing(listing(body), "t.s")


def test_register_ranges_overlap_by_range():
    (a,), (b,), (c,) = isa.parse_regs("v[4:7]"), isa.parse_regs("v[6:7]"), isa.parse_regs("v[8:9]")
    assert a.overlaps(b) and not a.overlaps(c) and not a.overlaps(isa.Reg("s", 4, 7))
    assert isa.describe_units(a.units() & b.units()) == "v[6:7]"


# --- asm-overlap ----------------------------------------------------------------------

MI355_LISTING = """
v_lshl_add_u64 v[6:7], v[4:5], 0, 16
v_lshl_add_u64 v[8:9], v[4:5], 0, 32
v_lshl_add_u64 v[10:11], v[4:5], 0, 48
;;#ASMSTART
global_load_dwordx4 v[4:7], v[4:5], off sc0 sc1 nt
global_load_dwordx4 v[8:11], v[6:7], off sc0 sc1 nt
global_load_dwordx4 v[12:15], v[8:9], off sc0 sc1 nt
global_load_dwordx4 v[16:19], v[10:11], off sc0 sc1 nt
;;#ASMEND
"""


def test_mi355_listing_is_flagged_on_a_bare_listing():
    (f,) = [f for f in check(MI355_LISTING) if f.fails]
    assert f.check == "asm-overlap" and "v[6:7]" in f.message


def test_disjoint_addresses_are_clean_on_a_bare_listing():
    fixed = MI355_LISTING.replace("v[4:7], v[4:5]", "v[4:7], v[20:21]").replace(
        "v[8:11], v[6:7]", "v[8:11], v[22:23]").replace("v[12:15], v[8:9]", "v[12:15], v[24:25]")
    fixed = fixed.replace("v[16:19], v[10:11]", "v[16:19], v[26:27]")
    assert failing_ids(check(fixed)) == set()


def test_hard_coded_temporaries_are_not_aliasing_on_a_bare_listing():
    body = """
;;#ASMSTART
v_accvgpr_write_b32 a0, 0
v_mfma_f32_16x16x16_f16 a[0:3], v[40:41], v[42:43], a[0:3]
s_nop 7
;;#ASMEND
"""
    assert "asm-overlap" not in failing_ids(check(body))


def test_mi355_listing_is_flagged_when_the_asm_separates_mnemonic_and_operands_by_tab():
    # clang copies inline asm into the listing verbatim: `"global_load_dwordx4\\t%0, ..."`
    assert "asm-overlap" in failing_ids(check(MI355_LISTING.replace("dwordx4 ", "dwordx4\t")))


TAB_MI355_LISTING = r'''
typedef float f4 __attribute__((ext_vector_type(4)));
__attribute__((global)) void k(const f4* p, f4* o) {
  f4 a, b, c, d;
  asm volatile("global_load_dwordx4\t%0, %4, off\n\t"
               "global_load_dwordx4\t%1, %5, off\n\t"
               "global_load_dwordx4\t%2, %6, off\n\t"
               "global_load_dwordx4\t%3, %7, off\n\t"
               "s_waitcnt vmcnt(0)"
               : "=v"(a), "=v"(b), "=v"(c), "=v"(d) : "v"(p), "v"(p + 1), "v"(p + 2), "v"(p + 3));
  o[0] = a + b + c + d;
}
'''


@requires_clang
@pytest.mark.parametrize("clobber", ["=v", "=&v"])
def test_tab_separated_four_load_block_from_clang_output(tmp_path: Path, clobber: str):
    src = tmp_path / "tab.hip"
    src.write_text(TAB_MI355_LISTING.replace('"=v"', f'"{clobber}"'))
    build, _ = amdgcn.compile_annotated(src)
    assert "global_load_dwordx4\tv[" in build.text  # the tab really reaches the listing
    found = "asm-overlap" in failing_ids(amdgcn.compile_and_check(src))
    assert found == (clobber == "=v")


@requires_clang
def test_mi355_four_load_block_is_flagged_from_clang_output():
    found = earlyclobber.static_check({"variant": "broken"})
    (f,) = [f for f in found if f.check == "asm-overlap"]
    assert "output %0 and input %5" in f.message and "v[2:3]" in f.message
    assert f.path.endswith("earlyclobber.hip")


@requires_clang
def test_mi355_four_load_block_with_early_clobber_outputs_is_clean_from_clang_output():
    assert failing_ids(earlyclobber.static_check({"variant": "fixed"})) == set()


@requires_clang
@pytest.mark.parametrize("mode", ["inputs", "base", "derived"])
def test_emitted_overlap_only_where_the_model_allows_it(tmp_path: Path, mode: str):
    for ec in itertools.product([False, True], repeat=3):
        spec = AsmBlockSpec(3, ec, mode, ec[:2] if mode == "derived" else ())
        src = tmp_path / f"g_{mode}.hip"
        src.write_text(spec.source())
        overlap = "asm-overlap" in failing_ids(amdgcn.compile_and_check(src))
        assert not overlap or block_hazard(spec), spec  # model-safe => compiled clean


# --- mfma-acc-read --------------------------------------------------------------------

TAIL = """
;;#ASMSTART
{mfma} a[0:15], v[0:1], v[2:3], a[0:15]
{tail}
v_accvgpr_read_b32 v4, a0
;;#ASMEND
"""


def test_nine_wait_state_tail_is_flagged_for_an_8_pass_mfma():
    found = check(TAIL.format(mfma="v_mfma_f32_32x32x8_f16", tail="s_nop 7\ns_nop 0"))
    (f,) = [f for f in found if f.fails]
    assert f.check == "mfma-acc-read" and "after 9 wait states" in f.message and "needs 11" in f.message


def test_eleven_wait_states_are_enough_for_an_8_pass_mfma():
    assert failing_ids(check(TAIL.format(mfma="v_mfma_f32_32x32x8_f16", tail="s_nop 7\ns_nop 2"))) == set()


def test_nine_wait_states_are_enough_for_a_4_pass_mfma():
    body = TAIL.format(mfma="v_mfma_f32_16x16x16_f16", tail="s_nop 7\ns_nop 0").replace("a[0:15]", "a[0:3]")
    assert failing_ids(check(body)) == set()


def test_the_shortest_path_decides():
    body = """
v_mfma_f32_32x32x8_f16 a[0:15], v[0:1], v[2:3], a[0:15]
s_cbranch_scc1 .LBB0_2
s_nop 15
.LBB0_2:
s_nop 5
v_accvgpr_read_b32 v4, a3
"""
    assert failing_ids(check(body)) == {"mfma-acc-read"}  # via the branch: 1 + 6 = 7 < 11


def test_gfx950_scaled_mfma_is_checked_with_llvms_gfx950_rule():
    body = """
;;#ASMSTART
v_mfma_scale_f32_16x16x128_f8f6f4 a[0:3], v[0:7], v[8:15], a[0:3], v20, v21{fmt}
{tail}
v_accvgpr_read_b32 v4, a0
;;#ASMEND
"""
    # an f8 matrix (the default format): 8 passes, 8 + 3 + 1 = 12 on gfx950
    assert failing_ids(check(body.format(fmt="", tail="s_nop 7\ns_nop 0"))) == {"mfma-acc-read"}
    assert failing_ids(check(body.format(fmt="", tail="s_nop 7\ns_nop 2"))) == {"mfma-acc-read"}
    assert failing_ids(check(body.format(fmt="", tail="s_nop 7\ns_nop 3"))) == set()
    # f4 x f4 (cbsz:4 blgp:4): 4 passes, 4 + 3 + 1 = 8
    assert failing_ids(check(body.format(fmt=" cbsz:4 blgp:4", tail="s_nop 7"))) == set()
    assert failing_ids(check(body.format(fmt=" cbsz:4 blgp:4", tail="s_nop 6"))) == {"mfma-acc-read"}


def test_unknown_mfma_shape_is_reported_not_passed():
    assert failing_ids(check("v_mfma_f32_99x99x9_f16 a[0:3], v[0:1], v[2:3], a[0:3]")) == {"mfma-unknown-shape"}


@requires_clang
def test_gfx950_scaled_mnemonic_passes_through_clang19_unassembled():
    build = compile_amdgcn(DATA / "gfx950_scaled.hip", label="gfx950-scaled")
    assert "v_mfma_scale_f32_16x16x128_f8f6f4" in build.text
    assert failing_ids(amdgcn.check_listing(build.text, str(build.path))) == {"mfma-acc-read"}


# --- mfma-src-war ---------------------------------------------------------------------

WAR = """
;;#ASMSTART
v_mfma_f32_32x32x8_f16 a[0:15], v[40:41], v[42:43], a[0:15]
{between}
ds_read_b64 {dst}, v48
s_waitcnt lgkmcnt(0)
v_mfma_f32_32x32x8_f16 a[0:15], {dst}, {dst}, a[0:15]
;;#ASMEND
"""


def test_lds_read_into_an_in_flight_mfma_source_is_flagged():
    found = check(WAR.format(between="s_nop 0", dst="v[40:41]"))
    assert failing_ids(found) == {"mfma-src-war"}


def test_lds_read_into_the_other_bank_is_clean():
    assert failing_ids(check(WAR.format(between="s_nop 0", dst="v[44:45]"))) == set()


def test_lds_read_after_a_dependent_mfma_is_clean():
    dep = "v_mfma_f32_32x32x8_f16 a[0:15], v[44:45], v[46:47], a[0:15]"
    assert failing_ids(check(WAR.format(between=dep, dst="v[40:41]"))) == set()


def test_lds_read_after_the_mfma_retired_is_clean():
    assert failing_ids(check(WAR.format(between="s_nop 15", dst="v[40:41]"))) == set()


# --- mfma-exit-parity -----------------------------------------------------------------

PARITY = """
;;#ASMSTART
ds_read_b64 v[40:41], v48
1:
s_cbranch_scc1 2f
v_mfma_f32_16x16x16_f16 a[0:3], v[40:41], v[40:41], a[0:3]
ds_read_b64 v[44:45], v48
s_cbranch_scc1 {even_exit}
v_mfma_f32_16x16x16_f16 a[0:3], v[44:45], v[44:45], a[0:3]
ds_read_b64 v[40:41], v48
s_branch 1b
2:
v_mfma_f32_16x16x16_f16 a[0:3], v[40:41], v[40:41], a[0:3]
s_branch 4f
3:
v_mfma_f32_16x16x16_f16 a[0:3], v[44:45], v[44:45], a[0:3]
4:
s_nop 15
;;#ASMEND
"""


def test_both_exit_tails_consume_their_own_bank():
    assert failing_ids(check(PARITY.format(even_exit="3f"))) == set()


def test_a_shared_exit_tail_drops_the_other_bank():
    found = check(PARITY.format(even_exit="2f"))
    (f,) = [f for f in found if f.fails]
    assert f.check == "mfma-exit-parity" and "v[44:45]" in f.message
