"""The source lint on every form of the early-clobber bug, each with a positive and a negative
case, and the block counts it reports (written from the MI355 megakernel PR's description:
four loads in one asm block, an output placed over a later load's address)."""
from __future__ import annotations

import json

import pytest

from hazards.static import asm_lint
from hazards.static.userbuild import Preprocessor
from static_helpers import ASM_LOOP, CLANG_MISSING, TWO_LOADS, hazards

requires_clang_e = pytest.mark.skipif(CLANG_MISSING is not None, reason=f"needs clang: {CLANG_MISSING}")


def lint(src: str, **kw):
    return [f for f in asm_lint.lint_text(src, "t.hip", **kw) if f.fails]


# --- "+v": read-write outputs --------------------------------------------------------------

# The two-load kernel with read-write outputs; {INIT} initialises them (or not).
PLUS = TWO_LOADS.replace("float4 a, b;", "float4 a{INIT}, b{INIT};").replace('"=v"', '"+v"')


def test_an_uninitialised_read_write_output_is_flagged():
    (f,) = lint(PLUS.replace("{INIT}", ""))
    assert f.line == 4 and '"+v" a' in f.message and "uninitialised" in f.message


def test_a_read_write_output_equal_to_an_input_is_flagged():
    src = ('void f(int x) { asm volatile("v_mov_b32 %0, 1\\n v_add_u32 %0, %0, %1" '
           ': "+v"(x) : "v"(x)); }')
    (f,) = lint(src)
    assert "same value" in f.message


# --- raw string templates ------------------------------------------------------------------

RAW = '''
__global__ void k(const float4* p, float4* o) {
  float4 a, b;
  asm volatile(R"asm(
    global_load_dwordx4 %0, %2, off
    global_load_dwordx4 %1, %3, off // a comment inside the template is text, not C
    s_waitcnt vmcnt(0)
  )asm" : "{C}"(a), "{C}"(b) : "v"(p), "v"(p + 1));
  o[0] = a; o[1] = b;
}
'''


def test_a_raw_string_template_is_read_and_flagged():
    (f,) = lint(RAW.replace("{C}", "=v"))
    assert f.line == 4 and "output %0" in f.message and "input %3" in f.message


# --- asm-written loops ---------------------------------------------------------------------


def test_a_loop_written_in_asm_carries_a_write_round_to_an_earlier_read():
    # in text order the load reads its address before anything is written; around the
    # loop, the next trip's load reads the address after this trip's load wrote the output
    (f,) = lint(ASM_LOOP.replace("{C}", "=v"))
    assert "around the asm-written loop" in f.message


# --- forms without the bug ------------------------------------------------------------------

# Each form of the sections above, written without the bug: the lint must leave it clean.
CLEAN_FORMS = {
    "an initialised read-write output":
        PLUS.replace("{INIT}", " = {0, 0, 0, 0}"),
    "a read-write output with early clobber":
        PLUS.replace("{INIT}", "").replace('"+v"', '"+&v"'),
    "a read-write output carried round a C loop (not undefined)":
        PLUS.replace("{INIT}", "").replace("  asm volatile", "  for (int i = 0; i < 4; ++i)\n  asm volatile"),
    "a parameter as read-write output (initialised)":
        ('void f(float4 a, const float4* p) { asm volatile("global_load_dwordx4 %0, %1, off\\n '
         'global_load_dwordx4 %0, %2, off" : "+v"(a) : "v"(p), "v"(p + 1)); }'),
    "a raw-string template with early clobber":
        RAW.replace("{C}", "=&v"),
    "a loop written in asm with early clobber":
        ASM_LOOP.replace("{C}", "=&v"),
    "a block with a forward branch only (not a loop)":
        ASM_LOOP.replace("1b", "2f").replace('"s_cmp_lg_u32 %2, 0\\n\\t"', '"s_cmp_lg_u32 %2, 0\\n\\t" "2:\\n\\t"')
        .replace("{C}", "=v"),
}


@pytest.mark.parametrize("form", CLEAN_FORMS)
def test_a_form_without_the_bug_is_clean(form):
    assert lint(CLEAN_FORMS[form]) == []


# --- templates built from function-like macros ---------------------------------------------

MACRO = '''#include "missing_project_header.h"
#define SRC(reg, off) "%" #reg ", off offset:" #off "\\n\\t"
#ifndef OUT
#define OUT "=v"
#endif
__global__ void k(const float4* p, float4* o) {
  float4 a, b;
  asm volatile("global_load_dwordx4 %0, " SRC(2, 0)
               "global_load_dwordx4 %1, " SRC(3, 16)
               "s_waitcnt vmcnt(0)"
               : OUT(a), OUT(b) : "v"(p), "v"(p + 1));
  o[0] = a; o[1] = b;
}
'''


def test_a_macro_template_without_a_preprocessor_is_reported_unchecked_and_counted_skipped():
    report = asm_lint.lint_source(MACRO, "t.hip")
    (f,) = report.findings
    assert (f.check, f.severity, f.fails) == ("asm-unchecked", "info", False)
    assert "SRC" in f.message and "--compile-commands" in f.message
    assert (report.checked, dict(report.skipped)) == (0, {"macro": 1})


@requires_clang_e
def test_a_macro_template_is_expanded_and_flagged_at_its_source_line(tmp_path):
    src = tmp_path / "k.hip"
    src.write_text(MACRO)
    report = asm_lint.lint_source(MACRO, str(src), expand=Preprocessor())
    (f,) = report.findings
    assert (f.check, f.path, f.line) == ("early-clobber", str(src), 8)
    assert "offset:16" in f.message and report.checked == 1 and report.expanded


@requires_clang_e
def test_a_macro_template_with_the_builds_define_is_expanded_clean(tmp_path):
    src = tmp_path / "k.hip"
    src.write_text(MACRO)
    report = asm_lint.lint_source(MACRO, str(src), expand=Preprocessor(extra=['-DOUT="=&v"']))
    assert report.findings == [] and report.checked == 1


@requires_clang_e
def test_compile_commands_json_gives_the_defines_of_the_build(tmp_path):
    src = tmp_path / "k.hip"
    src.write_text(MACRO)
    (tmp_path / "compile_commands.json").write_text(json.dumps([{
        "directory": str(tmp_path), "file": "k.hip",
        "arguments": ["hipcc", '-DOUT="=&v"', "-c", "k.hip", "-o", "k.o"]}]))
    clean = hazards("lint", str(src), cwd=tmp_path)  # found above the source
    assert clean.returncode == 0, clean.stdout + clean.stderr
    bad = hazards("lint", str(src), "-D", 'OUT="=v"', cwd=tmp_path)  # -D comes after the database's
    assert bad.returncode == 1 and f"{src}:8: error: [early-clobber]" in bad.stdout


@requires_clang_e
def test_asm_inside_a_function_like_macro_is_judged_at_each_expansion(tmp_path):
    text = '''#define LOAD2(a, b, p, q, C) asm volatile("global_load_dwordx4 %0, %2, off\\n" \\
    "global_load_dwordx4 %1, %3, off" : C(a), C(b) : "v"(p), "v"(q))
#define STR(x) #x
void f(const float4* p, float4* o) {
  float4 a, b;
  LOAD2(a, b, p, p + 1, "=&v");
  LOAD2(a, b, p, p + 1, "=v");
  o[0] = a + b;
}
'''
    src = tmp_path / "m.cpp"
    src.write_text(text)
    report = asm_lint.lint_source(text, str(src), expand=Preprocessor())
    assert [(f.check, f.line) for f in report.findings] == [("early-clobber", 7)]
    assert report.checked == 2


# --- counts ----------------------------------------------------------------------------------

def test_every_block_is_counted_checked_or_skipped_with_why(tmp_path):
    ptx = ('__device__ void g(const int* p) { int a, b; asm volatile("ld.global.u32 %0, [%2];\\n'
           '\\tld.global.u32 %1, [%3];" : "=r"(a), "=r"(b) : "l"(p), "l"(p + 1)); }\n')
    allowed = TWO_LOADS.replace("  asm volatile", "  // hazards: allow(early-clobber) reviewed\n  asm volatile")
    (tmp_path / "a.hip").write_text(TWO_LOADS + ptx)
    (tmp_path / "b.hip").write_text(allowed + MACRO.split("\n", 1)[1])
    (tmp_path / "c.cpp").write_text("int no_asm_here;\n")
    report = asm_lint.lint_report([tmp_path])
    per_file = {r.path.rsplit("/", 1)[1]: (r.checked, dict(r.skipped)) for r in report.files}
    assert per_file == {"a.hip": (1, {"ptx": 1}), "b.hip": (0, {"allowlisted": 1, "macro": 1}),
                        "c.cpp": (0, {})}
    assert (report.checked, dict(report.skipped)) == (1, {"ptx": 1, "allowlisted": 1, "macro": 1})
    assert report.summary() == ("3 source file(s), 4 asm block(s): 1 checked, 3 skipped "
                                "(1 allowlisted, 1 macro, 1 ptx)")


def test_the_lint_command_prints_the_counts_per_file_and_in_total(tmp_path):
    (tmp_path / "a.hip").write_text(TWO_LOADS)
    proc = hazards("lint", "-v", "--no-expand", str(tmp_path))
    assert proc.returncode == 1
    assert f"{tmp_path / 'a.hip'}: 1 asm block(s), 1 checked, 0 skipped" in proc.stderr
    assert "1 source file(s), 1 asm block(s): 1 checked, 0 skipped" in proc.stderr


# --- outputs tied to an input ("0"): a read-write operand spelled two ways ----------------

TIED = '''void f(float a, float b0, float b1{PARAMS}) {{DECL}
  asm volatile("v_fmac_f32 %0, %2, %3\\n\\tv_fmac_f32 %1, %2, %4"
               : "=v"(c0), "=v"(c1) : "v"(a), "v"(b0), "v"(b1), "0"(c0), "1"(c1));
}
'''


def test_an_output_tied_to_a_defined_input_holds_that_value_and_is_clean():
    assert lint(TIED.replace("{PARAMS}", ", float& c0, float& c1").replace("{DECL}", "")) == []


def test_an_output_tied_to_an_undefined_input_is_flagged():
    (f,) = lint(TIED.replace("{PARAMS}", "").replace("{DECL}", "\n  float c0, c1;"))
    assert '"=v" c0' in f.message and "uninitialised" in f.message


@requires_clang_e
def test_an_allowlist_comment_still_silences_a_block_judged_after_expansion(tmp_path):
    src = tmp_path / "k.hip"
    allowed = MACRO.replace("  asm volatile", "  // hazards: allow(early-clobber) seeded on purpose\n  asm volatile")
    src.write_text(allowed)
    report = asm_lint.lint_source(allowed, str(src), expand=Preprocessor())
    assert report.findings == [] and dict(report.skipped) == {"allowlisted": 1}
    report = asm_lint.lint_source(allowed, str(src), honor_allowlist=False, expand=Preprocessor())
    assert [f.check for f in report.findings] == ["early-clobber"]
