"""Source lint of inline asm: each rule with a minimal positive and negative case."""
from __future__ import annotations

import pytest
from hypothesis import given, settings

from hazards.static import asm_lint, cscan
from hazards.strategies.static import asm_blocks, block_hazard
from static_helpers import TWO_LOADS, requires_clang


def lint(src: str, **kw):
    return asm_lint.lint_text(src, "t.hip", **kw)


def test_two_loads_with_plain_outputs_are_flagged_with_file_line_and_block():
    (f,) = lint(TWO_LOADS)
    assert (f.check, f.severity, f.path, f.line) == ("early-clobber", "error", "t.hip", 4)
    assert "output %0" in f.message and "input %3" in f.message
    assert "global_load_dwordx4 %1, %3" in f.snippet


def test_tab_between_mnemonic_and_operands_is_still_flagged():
    (f,) = lint(TWO_LOADS.replace("dwordx4 %", "dwordx4\\t%"))
    assert "output %0" in f.message and "input %3" in f.message
    assert lint(TWO_LOADS.replace("dwordx4 %", "dwordx4\\t%").replace('"=v"', '"=&v"')) == []


def test_early_clobber_outputs_are_clean():
    assert lint(TWO_LOADS.replace('"=v"', '"=&v"')) == []


def test_only_the_last_output_may_stay_plain():
    src = TWO_LOADS.replace('"=v"(a)', '"=&v"(a)')
    assert lint(src) == []  # output 1 is written by the last load: no input read after it


def test_single_instruction_block_is_clean():
    src = 'void f(int* p){ int a; asm volatile("global_load_dword %0, %1, off" : "=v"(a) : "v"(p)); }'
    assert lint(src) == []


def test_tied_and_read_write_operands_holding_defined_values_are_clean():
    tied = ('void f(int x){ int a; asm("v_mov_b32 %0, 1\\n v_add_u32 %0, %0, %1" '
            ': "=v"(a) : "0"(x)); }')
    inout = ('void f(int x, int y){ asm("v_mov_b32 %0, 1\\n v_add_u32 %0, %0, %0" '
             ': "+v"(x)); }')
    assert lint(tied) == [] and lint(inout) == []


def test_output_and_input_in_different_register_files_cannot_alias():
    src = ('void f(int n){ float r; asm volatile("v_accvgpr_read_b32 %0, a0\\n s_cmp_eq_u32 %1, 0"'
           ' : "=v"(r) : "s"(n)); }')
    assert lint(src) == []


def test_ptx_templates_are_skipped_because_ptx_registers_are_virtual():
    src = ('__device__ void f(const int* p){ int a, b; asm volatile("ld.global.u32 %0, [%2];\\n'
           '\\tld.global.u32 %1, [%3];" : "=r"(a), "=r"(b) : "l"(p), "l"(p+1)); }')
    assert lint(src) == []


def test_generic_isa_is_checked_conservatively():
    # x86 AT&T: the classic GCC early-clobber bug (mov clobbers %2 before add reads it)
    src = 'int f(int x, int y){ int r; asm("movl %1, %0; addl %2, %0" : "=r"(r) : "r"(x), "r"(y)); return r; }'
    assert [f.check for f in lint(src)] == ["early-clobber"]
    assert lint(src.replace('"=r"', '"=&r"')) == []


def test_string_macros_and_continued_macro_bodies_are_resolved():
    src = '''
#ifdef FIXED
#define OUT "=&v"
#else
#define OUT "=v"
#endif
#define LOAD "global_load_dwordx4 "
#define TWO(a, b, p, q) asm volatile(LOAD "%0, %2, off\\n" \\
      LOAD "%1, %3, off" : OUT(a), OUT(b) : "v"(p), "v"(q))
'''
    (f,) = lint(src)
    assert f.line == 8 and '"=&v" or "=v"' in f.message  # one definition may lack the &


def test_allowlist_comment_with_reason_silences_a_reviewed_block():
    src = TWO_LOADS.replace("  asm volatile", "  // hazards: allow(early-clobber) seeded on purpose\n  asm volatile")
    assert lint(src) == []
    assert len(lint(src, honor_allowlist=False)) == 1


def test_allowlist_comment_without_reason_is_ignored_and_reported():
    src = TWO_LOADS.replace("  asm volatile", "  // hazards: allow(early-clobber)\n  asm volatile")
    checks = sorted((f.severity, f.check) for f in lint(src))
    assert checks == [("error", "early-clobber"), ("warning", "allow-no-reason")]


def test_allowlist_for_another_check_does_not_silence():
    src = TWO_LOADS.replace("  asm volatile", "  // hazards: allow(mfma-acc-read) not this\n  asm volatile")
    assert [f.severity for f in lint(src)] == ["error"]


def test_asm_inside_strings_and_comments_is_not_a_statement():
    src = '/* asm volatile("a %0\\n b %1" : "=v"(x) : "v"(y)); */ const char* s = "asm(";'
    assert cscan.asm_statements(src) == []


def test_preprocessed_text_maps_findings_to_original_lines():
    pre = '# 1 "orig.hip"\n\n\n# 40 "orig.hip"\n' + TWO_LOADS
    (f,) = lint(pre, line_map=cscan.line_map(pre))
    assert (f.path, f.line) == ("orig.hip", 43)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(asm_blocks())
def test_lint_agrees_with_the_structural_model_on_generated_blocks(spec):
    assert bool(lint(spec.source())) == block_hazard(spec)


def test_a_file_too_large_to_lint_is_reported_not_passed_as_clean(tmp_path, monkeypatch):
    big, plain = tmp_path / "big.hip", tmp_path / "plain.hip"
    big.write_text(TWO_LOADS)
    plain.write_text("int x;\n")
    monkeypatch.setattr(asm_lint, "MAX_FILE_BYTES", 16)
    (f,) = asm_lint.lint_paths([big, plain])
    assert f.fails and f.path == str(big) and "not linted" in f.message


def test_an_unreadable_file_is_reported_not_passed_as_clean(tmp_path, monkeypatch):
    src = tmp_path / "k.hip"
    src.write_text(TWO_LOADS)

    def denied(self, *a, **kw):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(src), "read_text", denied)  # root ignores chmod 000
    (f,) = asm_lint.lint_paths([src])
    assert f.fails and "not linted" in f.message and "Permission denied" in f.message


MACRO_TEMPLATE = '''
#define SRC(reg, off) "%" #reg ", off offset:" #off "\\n\\t"
__global__ void k(const float4* p, float4* o) {
  float4 a, b;
  asm volatile("global_load_dwordx4 %0, " SRC(2, 0)
               "global_load_dwordx4 %1, " SRC(3, 16)
               "s_waitcnt vmcnt(0)"
               : %s(a), %s(b) : "v"(p), "v"(p + 1));
  o[0] = a; o[1] = b;
}
'''


def test_a_template_built_from_function_like_macros_is_reported_unchecked_not_clean():
    (f,) = lint(MACRO_TEMPLATE.replace("%s", '"=v"'))
    assert (f.severity, f.line) == ("info", 5) and not f.fails
    assert "not checked" in f.message and "SRC" in f.message


def test_an_unexpandable_template_with_early_clobber_outputs_needs_no_note():
    assert lint(MACRO_TEMPLATE.replace("%s", '"=&v"')) == []


def test_an_allowlist_comment_may_open_the_comment_block_above_the_statement():
    src = TWO_LOADS.replace("  asm volatile", "  // hazards: allow(early-clobber) seeded on purpose; the\n"
                                              "  // reason goes on over a second line\n  asm volatile")
    assert lint(src) == []
    detached = src.replace("  // reason goes on", "  int unrelated;\n  // reason goes on")
    assert [f.check for f in lint(detached)] == ["early-clobber"]


# ---- values across functions and names; inputs written; #if-chosen constraints (item 7) ------

REF_PARAM = '''typedef float f4 __attribute__((ext_vector_type(4)));
__device__ void load2(f4& acc, const f4* p) {
  asm volatile("global_load_dwordx4 %0, %1, off\\n\\t"
               "global_load_dwordx4 %0, %2, off"
               : "+v"(acc) : "v"(p), "v"(p + 1));
}
__global__ void k(const f4* p, f4* o) {
  f4 acc{DECL};
  load2(acc, p);
  o[0] = acc;
}
'''


@pytest.mark.parametrize("decl,flagged", [(";", True), (" = {0, 0, 0, 0};", False)])
def test_a_read_write_reference_parameter_is_undefined_when_its_caller_never_initialised_it(decl, flagged):
    src = REF_PARAM.replace("{DECL};", decl)
    found = lint(src)
    assert [(f.check, f.line) for f in found] == ([("early-clobber", 3)] if flagged else [])
    if flagged:
        assert "uninitialised" in found[0].message


SAME_VALUE = '''__global__ void k(const float* p, float* o) {
  float x = p[threadIdx.x];
  float y = p[threadIdx.x + 64];
  {ASSIGN}
  asm volatile("v_add_f32 %0, %0, %1\\n\\t"
               "v_mul_f32 %0, %0, %1" : "+v"(acc) : "v"(x));
  o[threadIdx.x] = acc;
}
'''


@pytest.mark.parametrize("assign,flagged", [
    ("float acc = x;", True),                 # the accumulator holds the input's value
    ("float acc; acc = x;", True),            # assigned, not initialised: the same
    ("float acc = y;", False),                # another value: its own register
    ("float acc = x; x = x * 2.0f;", False),  # the input changed after the copy
])
def test_a_read_write_operand_assigned_an_inputs_value_under_another_name_may_share_its_register(
        assign, flagged):
    found = lint(SAME_VALUE.replace("{ASSIGN}", assign))
    assert [f.check for f in found] == (["early-clobber"] if flagged else [])
    if flagged:
        assert "same value" in found[0].message


WRITES_INPUT = '''__global__ void k(unsigned* p, unsigned x) {
  asm volatile("v_add_u32 %0, %0, 1\\n\\t"
               "global_store_dword %1, %0, off" : {OUT} : "v"(x), "v"(p));
  p[1] = x;
}
'''


def test_an_instruction_that_writes_an_input_only_operand_is_its_own_finding():
    (f,) = lint(WRITES_INPUT.replace("{OUT}", ""))
    assert (f.check, f.severity, f.line) == ("asm-writes-input", "error", 2)
    assert "`v_add_u32 %0, %0, 1`" in f.message and "%0" in f.message


def test_writing_an_output_or_a_tied_input_is_not_writing_an_input():
    tied = WRITES_INPUT.replace("{OUT} : \"v\"(x)", "\"=v\"(x) : \"0\"(x)").replace("%1, %0", "%2, %0")
    assert [f.check for f in lint(tied)] == []
    stores_only = '__global__ void k(unsigned* p, unsigned x) { asm volatile("global_store_dword %0, %1, off" :: "v"(p), "v"(x)); }'
    assert lint(stores_only) == []


IF_CHOSEN = '''#ifdef SAFE
#define OUT "=&v"
#else
#define OUT "=v"
#endif
__global__ void k(const float4* p, float4* o) {
  float4 a, b;
  asm volatile("global_load_dwordx4 %0, %2, off\\n\\t"
               "global_load_dwordx4 %1, %3, off\\n\\t"
               "s_waitcnt vmcnt(0)" : OUT(a), OUT(b) : "v"(p), "v"(p + 1));
  o[0] = a; o[1] = b;
}
'''


@requires_clang
@pytest.mark.parametrize("defines,flagged", [(["-DSAFE"], False), ([], True)])
def test_a_constraint_macro_chosen_by_if_is_judged_with_the_active_defines(tmp_path, defines, flagged):
    from hazards.static.userbuild import preprocessor_for

    src = tmp_path / "k.hip"
    src.write_text(IF_CHOSEN)
    report = asm_lint.lint_report([src], expand=preprocessor_for(defines))
    assert [(f.check, f.line) for f in report.findings if f.fails] == ([("early-clobber", 8)] if flagged else [])
    assert report.checked == 1


def test_without_a_preprocessor_an_if_chosen_constraint_is_judged_on_every_definition():
    (f,) = lint(IF_CHOSEN)
    assert '"=&v" or "=v"' in f.message
