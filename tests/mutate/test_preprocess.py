"""Sites are found on the preprocessor's output mapped back to source lines: a branch over a
macro only a header defines is decided as the compiler decides it, a macro that expands to a
fence is mutated at its use site, and without a preprocessor the text scanner is used with a
one-line note. Each installed preprocessor (nvcc, clang, cpp) is checked on its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hazards.engine import toolchain
from hazards.engine.errors import ToolchainMissing
from hazards.mutate.conditionals import inactive_lines
from hazards.mutate.mutants import SitesNote, mutants_of
from hazards.mutate.preprocess import find_live, groups

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("nvcc", "clang", "cpp")

# USE_FENCE is 0 in a header: the compiler drops line 4; the text scanner cannot know that.
HEADER = "#pragma once\n#define USE_FENCE 0\n#define KFENCE() __threadfence()\n#define KSYNC __syncthreads()\n"
SOURCE = textwrap.dedent("""\
    #include "cfg.h"
    __global__ void k(int* d, int* f) {
    #if USE_FENCE
      __threadfence_system();
    #endif
      d[0] = 1;
      KFENCE();
      KSYNC;
      f[0] = 1;
    }
    #ifdef __CUDA_ARCH__
    __device__ void dev() { __threadfence_block(); }
    #else
    void host() { std::atomic_thread_fence(std::memory_order_seq_cst); }
    #endif
    """)


@pytest.fixture(params=TOOLS)
def only_tool(request, monkeypatch):
    """Exactly one preprocessor visible (the others overridden to a path that does not exist)."""
    for other in TOOLS:
        if other != request.param:
            monkeypatch.setenv(toolchain.TOOLS[other].env_var, "/nonexistent/" + other)
    try:
        toolchain.find_tool(request.param)
    except ToolchainMissing as e:
        pytest.skip(f"{request.param} not installed: {e}")
    return request.param


def _project(tmp_path: Path) -> Path:
    (tmp_path / "cfg.h").write_text(HEADER)
    src = tmp_path / "k.cu"
    src.write_text(SOURCE)
    return src


def test_a_branch_over_a_header_macro_is_decided_by_the_preprocessor(tmp_path, only_tool):
    src = _project(tmp_path)
    notes: list[SitesNote] = []
    _, found = mutants_of(src, notes=notes)
    ids = {m.id for m in found}
    assert "remove-fence@4" not in ids, notes  # USE_FENCE is 0 in cfg.h
    assert {"remove-fence@12", "remove-fence@14"} <= ids  # device and host passes both count
    assert only_tool in notes[0].how or (only_tool == "clang" and "clang" in notes[0].how), notes
    # The text scanner alone keeps line 4 (it cannot read cfg.h): what the preprocessor adds.
    _, scanned = mutants_of(src, preprocess=False)
    assert "remove-fence@4" in {m.id for m in scanned}


def test_a_macro_that_expands_to_a_fence_is_mutated_at_its_use_site(tmp_path, only_tool):
    src = _project(tmp_path)
    text, found = mutants_of(src)
    by_id = {m.id: m for m in found}
    fence, barrier = by_id["remove-fence@7"], by_id["remove-barrier@8"]
    assert "KFENCE()" in fence.description and "__threadfence" in fence.description
    assert "KFENCE" not in fence.apply(text) and "KSYNC" in fence.apply(text)
    assert "KSYNC" not in barrier.apply(text)
    # The definitions live in the header: nothing of cfg.h is a site of k.cu.
    assert all(m.path == str(src) for m in found)


def test_without_a_preprocessor_the_text_scanner_is_used_with_a_one_line_note(tmp_path):
    src = _project(tmp_path)
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", str(src), "--list", "--json"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={"PATH": "/nonexistent", "PYTHONPATH": str(REPO), "CUDA_HOME": "/nonexistent",
                              **{toolchain.TOOLS[t].env_var: "/nonexistent/" + t for t in TOOLS}})
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("\n") == 1 and "no preprocessor found" in res.stderr and "text scanner" in res.stderr
    got = json.loads(res.stdout)
    assert "text scanner" in got["sites"][0]
    assert "remove-fence@4" in {m["id"] for m in got["mutants"]}  # the scanner cannot decide USE_FENCE


def test_a_missing_header_is_read_as_empty_and_named(tmp_path, only_tool):
    src = tmp_path / "k.cu"
    src.write_text('#include "not_here/cfg.h"\n#include <cuda/not_a_header>\n__global__ void k(){ __syncthreads(); }\n')
    live, how = find_live(src, src.read_text())
    assert live is not None, how
    assert "not_here/cfg.h" in how and "cuda/not_a_header" in how


def test_only_a_source_the_preprocessor_did_not_decide_in_full_gets_a_note_for_stderr(tmp_path, only_tool):
    # `incomplete` (what `hazards mutate` prints as a note) comes from what the preprocessor
    # did, not from the note's words: headers read as empty, or no preprocessor succeeded
    missing = tmp_path / "k.cu"
    missing.write_text('#include "not_here/cfg.h"\n__global__ void k(){ __syncthreads(); }\n')
    failing = tmp_path / "e.cu"
    failing.write_text('#error "this build is not supported"\n__global__ void k(){ __syncthreads(); }\n')
    (tmp_path / "ok").mkdir()
    complete = _project(tmp_path / "ok")
    notes: list[SitesNote] = []
    for src in (missing, failing, complete):
        mutants_of(src, notes=notes)
    mutants_of(missing, preprocess=False, notes=notes)  # the user asked for the scanner
    incomplete = [note for note in notes if note.incomplete]
    assert incomplete == notes[:2], notes
    assert "not_here/cfg.h" in incomplete[0].how and "text scanner" in incomplete[1].how


def test_a_preprocessor_error_falls_back_to_the_text_scanner(tmp_path, only_tool):
    src = tmp_path / "k.cu"
    src.write_text('#error "this build is not supported"\n__global__ void k(){ __syncthreads(); }\n')
    live, how = find_live(src, src.read_text())
    assert live is None and "failed" in how and "text scanner" in how


def test_groups_follow_nesting_and_else_branches():
    code = "a\n#if A\nb\n#if B\nc\n#endif\nd\n#elif defined(C)\ne\n#else\nf\n#endif\ng\n"
    owner, found = groups(code)
    assert owner == [None, None, 0, 0, 1, 1, 0, 0, 2, 2, 3, 3, None, None]
    assert [g.after for g in found] == [1, 3, 7, 9]
    assert [g.parent for g in found] == [None, 0, None, None]
    assert [sorted(g.names) for g in found] == [["A"], ["B"], ["A", "C"], ["A", "C"]]


def test_a_headers_branch_over_a_macro_its_includer_may_define_is_kept(tmp_path, only_tool):
    # A header tests INCLUDER_FLAG, which only a .cu including it defines: preprocessed alone
    # it would look dead; it is kept (and said so). A name of the implementation's own
    # (__NOT_THIS_COMPILER__) is decided as the compiler decides it, in a header too.
    body = ("#ifdef INCLUDER_FLAG\n__device__ void f() { __threadfence(); }\n#endif\n"
            "#ifdef __NOT_THIS_COMPILER__\n__device__ void g() { __syncthreads(); }\n#endif\n")
    header, unit = tmp_path / "k.cuh", tmp_path / "k.cu"
    header.write_text(body)
    unit.write_text(body)
    notes: list[SitesNote] = []
    _, in_header = mutants_of(header, notes=notes)
    _, in_unit = mutants_of(unit)
    assert [m.id for m in in_header] == ["remove-fence@2"] and "includer may define" in notes[0].how
    assert in_unit == []


def test_the_fallback_scanner_does_not_trust_a_define_in_an_undecided_branch():
    # HAVE_X is defined in a branch over an unknown macro: after it, HAVE_X is unknown and
    # both branches over it stay (it dropped the cp.async waits of compat.h before).
    text = "#if UNKNOWN_ARCH >= 800\n#define HAVE_X 1\n#else\n#define HAVE_X 0\n#endif\n#if HAVE_X\nx\n#endif\n"
    assert inactive_lines(text) == set()


def test_every_define_given_reaches_the_preprocessor(tmp_path, only_tool):
    # -D names with leading underscores too (they were dropped: `-D__MY_BUILD__` kept nothing live).
    src = tmp_path / "k.cu"
    src.write_text("#ifdef __MY_BUILD__\n__device__ void f() { __threadfence(); }\n#endif\n")
    _, off = mutants_of(src)
    _, on = mutants_of(src, defines={"__MY_BUILD__": "1"})
    assert off == [] and [m.id for m in on] == ["remove-fence@2"]


def test_a_comment_that_a_directive_opens_over_several_lines_does_not_hide_its_branch(tmp_path, only_tool):
    # The live-group marker went on the line after the directive, inside its comment: the
    # branch looked dead and its fence was never mutated.
    src = tmp_path / "k.cu"
    src.write_text("__device__ void f(int* d, int* g) {\n  d[0] = 1;\n"
                   "#ifdef __CUDA_ARCH__ /* the device\n   path */\n  __threadfence();\n#endif\n  g[0] = 1;\n}\n"
                   "#if 0 /* never\n   built */\n__device__ void h() { __syncthreads(); }\n#endif\n")
    _, found = mutants_of(src)
    assert [m.id for m in found] == ["remove-fence@5"]


def test_a_branch_over_a_macro_a_missing_header_may_define_is_kept_and_said(tmp_path, only_tool):
    # cfg/config.h is found by the build's -I, not here: read as empty, USE_SYSTEM_FENCE looked
    # undefined and the fence in its branch was never mutated, with nothing said on stderr
    src = tmp_path / "k.cu"
    src.write_text('#include "cfg/config.h"\n__global__ void k(int* d, int* f) {\n  d[0] = 1;\n'
                   "#if USE_SYSTEM_FENCE\n  __threadfence_system();\n#else\n  __threadfence();\n#endif\n"
                   "#ifdef __NOT_THIS_COMPILER__\n  __syncthreads();\n#endif\n  f[0] = 1;\n}\n")
    notes: list[SitesNote] = []
    _, found = mutants_of(src, notes=notes)
    assert [m.id for m in found] == ["remove-fence@5", "remove-fence@7"], notes
    assert "cfg/config.h" in notes[0].how and "a header read as empty may define them" in notes[0].how
    res = subprocess.run([sys.executable, "-m", "hazards", "mutate", str(src), "--list"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0 and "cfg/config.h" in res.stderr, res.stderr


def test_a_preprocessor_that_runs_past_its_timeout_leaves_no_process_behind(tmp_path, stray_sleep):
    # nvcc -E runs gcc under it: the timeout killed only nvcc
    from hazards.static.asm_lint import ExpandError
    from hazards.static.userbuild import preprocess_with_stubs

    src = tmp_path / "k.cu"
    src.write_text("int x;\n")
    (tmp_path / "stubs").mkdir()
    with pytest.raises(ExpandError, match="timed out"):
        preprocess_with_stubs(["sh", "-c", stray_sleep.command], src, tmp_path / "stubs", [], timeout_s=0.5)
    assert not stray_sleep.left(), "the preprocessor's child outlived its timeout"
