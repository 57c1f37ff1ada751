"""The compiled mode on a user's own sources: every form of the early-clobber bug seen in the
registers clang-19 really allocated (with the installed HIP headers), findings at source
lines, the flags of compile_commands.json, and build files kept out of the user's folders."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hazards.engine import toolchain
from hazards.engine.errors import ToolchainMissing, UserError
from hazards.static import compiled, userbuild
from hazards.static.userbuild import device_lib_args, hip_headers_found
from hazards.engine.toolchain import SM90A
from killed_phase import in_a_killed_phase
from static_helpers import ASM_LOOP, CLANG_MISSING, DATA, NVDISASM_MISSING, hazards, requires_clang


def _hip_missing() -> str | None:
    if CLANG_MISSING:
        return CLANG_MISSING
    clang = toolchain.find_tool("clang")
    if not hip_headers_found(clang) or "-nogpulib" in device_lib_args(clang, "gfx942"):
        return "needs ROCm's HIP headers and device libraries (scripts/setup.sh installs them)"
    return None


requires_hip = pytest.mark.skipif(_hip_missing() is not None, reason=str(_hip_missing()))
requires_sass = pytest.mark.skipif(NVDISASM_MISSING is not None, reason=f"needs nvcc and nvdisasm: {NVDISASM_MISSING}")

HEAD = "#include <hip/hip_runtime.h>\n"
FOUR_LOADS = HEAD + '''typedef float f4 __attribute__((ext_vector_type(4)));
__global__ void k(const f4* p, f4* o) {
  f4 a{INIT}, b{INIT}, c{INIT}, d{INIT};
  asm volatile("global_load_dwordx4 %0, %4, off\\n\\t"
               "global_load_dwordx4 %1, %5, off\\n\\t"
               "global_load_dwordx4 %2, %6, off\\n\\t"
               "global_load_dwordx4 %3, %7, off\\n\\t"
               "s_waitcnt vmcnt(0)"
               : "{C}"(a), "{C}"(b), "{C}"(c), "{C}"(d) : "v"(p), "v"(p + 1), "v"(p + 2), "v"(p + 3));
  o[threadIdx.x] = a + b + c + d;
}
'''


def check(tmp_path: Path, text: str, name: str = "k.hip", flags=()) -> list:
    src = tmp_path / name
    src.write_text(text)
    return [f for f in compiled.check_jobs(compiled.jobs_for_files([src], list(flags))) if f.fails]


@requires_hip
@pytest.mark.parametrize("constraint,init,hazard", [
    ("=v", "", True), ("=&v", "", False),            # the MI355 megakernel PR's block and its fix
    ("+v", "", True), ("+v", " = {0, 0, 0, 0}", False),  # read-write: undefined vs initialised
])
def test_each_output_form_is_judged_from_the_registers_clang_allocated(tmp_path, constraint, init, hazard):
    found = check(tmp_path, FOUR_LOADS.replace("{C}", constraint).replace("{INIT}", init))
    assert [(f.check, f.line) for f in found] == ([("asm-overlap", 5)] if hazard else [])
    if hazard:
        assert "global_load_dwordx4" in found[0].message and "before" in found[0].message


@requires_hip
def test_a_macro_template_compiles_annotated_and_is_flagged_at_its_line(tmp_path):
    text = HEAD + '''typedef float f4 __attribute__((ext_vector_type(4)));
#define SRC(reg, off) "%" #reg ", off offset:" #off "\\n\\t"
#define LOADS(o0, o1) "global_load_dwordx4 " #o0 ", " SRC(2, 0) "global_load_dwordx4 " #o1 ", " SRC(3, 16)
__global__ void k(const f4* p, f4* o) {
  f4 a, b;
  asm volatile(LOADS(%0, %1) : "{C}"(a), "{C}"(b) : "v"(p), "v"(p + 1));
  o[threadIdx.x] = a + b;
}
'''
    # the template ends in a function-like macro: the annotation goes after its expansion
    assert [(f.check, f.line) for f in check(tmp_path, text.replace("{C}", "=v"))] == [("asm-overlap", 7)]
    assert check(tmp_path, text.replace("{C}", "=&v"), "k2.hip") == []


@requires_hip
def test_a_raw_string_template_is_compiled_and_flagged(tmp_path):
    text = FOUR_LOADS.replace('''"global_load_dwordx4 %0, %4, off\\n\\t"
               "global_load_dwordx4 %1, %5, off\\n\\t"
               "global_load_dwordx4 %2, %6, off\\n\\t"
               "global_load_dwordx4 %3, %7, off\\n\\t"
               "s_waitcnt vmcnt(0)"''', '''R"(global_load_dwordx4 %0, %4, off
               global_load_dwordx4 %1, %5, off
               global_load_dwordx4 %2, %6, off
               global_load_dwordx4 %3, %7, off
               s_waitcnt vmcnt(0))"''')
    assert [f.check for f in check(tmp_path, text.replace("{C}", "=v").replace("{INIT}", ""))] == ["asm-overlap"]
    assert check(tmp_path, text.replace("{C}", "=&v").replace("{INIT}", ""), "k2.hip") == []


LOOP = HEAD + ASM_LOOP


@requires_hip
def test_an_asm_written_loop_is_judged_around_its_back_branch(tmp_path):
    (f,) = check(tmp_path, LOOP.replace("{C}", "=v"))
    assert f.check == "asm-overlap" and "around the asm-written loop" in f.message
    assert check(tmp_path, LOOP.replace("{C}", "=&v"), "k2.hip") == []


@requires_hip
def test_a_block_that_reads_back_its_own_output_is_not_an_overlap(tmp_path):
    text = HEAD + '''__global__ void k(const int* p, int* o) {
  int in = p[threadIdx.x], out;
  asm volatile("v_add_u32 %0, %1, 1\\n\\tv_mul_lo_u32 %0, %0, {R}" : "=v"(out) : "v"(in));
  o[threadIdx.x] = out;
}
'''
    # clang gives `out` the register of `in` (dead after the block): reading %0 back is fine,
    # reading %1 after %0 was written is not - and the message names that pair
    assert check(tmp_path, text.replace("{R}", "%0")) == []
    (f,) = check(tmp_path, text.replace("{R}", "%1"), "k2.hip")
    assert "v_add_u32" in f.message and "v_mul_lo_u32" in f.message and "%1" in f.message


@requires_hip
def test_fences_and_barriers_of_the_hip_headers_are_seen(tmp_path):
    text = HEAD + '''__global__ void arrive(float* part, int* counter) {
  part[threadIdx.x] = 1.0f;
  {FENCE}
  __syncthreads();
  if (threadIdx.x == 0) __hip_atomic_fetch_add(counter, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
'''
    (f,) = check(tmp_path, text.replace("{FENCE}", ""))
    assert (f.check, f.line) == ("release-order", 6) and "s_barrier" in f.message
    assert check(tmp_path, text.replace("{FENCE}", "__threadfence();"), "k2.hip") == []


@requires_hip
def test_the_flags_of_compile_commands_json_reach_the_compiler(tmp_path):
    src = tmp_path / "src" / "k.hip"
    src.parent.mkdir()
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "constraint.h").write_text('#define OUT "=&v"\n')
    src.write_text('#include "constraint.h"\n' + FOUR_LOADS.replace('"{C}"', "OUT").replace("{INIT}", ""))
    db = tmp_path / "build" / "compile_commands.json"
    db.parent.mkdir()
    db.write_text(json.dumps([{"directory": str(tmp_path / "build"), "file": "../src/k.hip",
                               "command": "hipcc -I../inc --offload-arch=gfx90a -O2 -c ../src/k.hip -o k.o"}]))
    ok = hazards("static", "--compile-commands", str(db))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (tmp_path / "inc" / "constraint.h").write_text('#define OUT "=v"\n')  # an edited header is a new build
    bad = hazards("static", "--compile-commands", str(db))
    assert bad.returncode == 1 and f"{src.resolve()}:6: error: [asm-overlap]" in bad.stdout


@requires_hip
def test_the_compile_option_takes_the_flags_after_a_double_dash(tmp_path):
    src = tmp_path / "k.hip"
    src.write_text(FOUR_LOADS.replace('"{C}"', "OUT").replace("{INIT}", ""))
    bad = hazards("static", "--compile", str(src), "--", '-DOUT="=v"')
    assert bad.returncode == 1 and "[asm-overlap]" in bad.stdout and "1 compiled source build" in bad.stderr
    assert hazards("static", "--compile", str(src), "--", '-DOUT="=&v"').returncode == 0


@requires_hip
def test_a_source_that_does_not_compile_is_an_error_that_exits_3_not_a_pass(tmp_path):
    (f,) = check(tmp_path, HEAD + "__global__ void k() { this is not C++; }\n")
    assert (f.check, f.severity) == ("compile-failed", "error") and "not checked" in f.message
    proc = hazards("static", "--compile", str(tmp_path / "k.hip"))
    assert proc.returncode == 3 and "[compile-failed]" in proc.stdout, proc.stdout + proc.stderr
    assert "0 failing finding(s)" in proc.stderr and "1 check(s) could not run" in proc.stderr


@requires_sass
def test_nvidia_sources_get_the_sass_checks_at_source_lines(tmp_path):
    src = tmp_path / "p.cu"
    shutil.copy(DATA / "polls_precision.cu", src)
    found = check(tmp_path, src.read_text(), "p.cu")
    assert {f.check for f in found} == {"poll-no-acquire"}
    assert all(f.path == str(src) and f.line > 0 for f in found)
    assert len(found) == 4  # the four `_flagged` kernels, once each


@requires_sass
def test_a_cubins_listing_is_never_written_next_to_it_nor_read_stale(tmp_path):
    from hazards.static.compile import compile_cubin

    cubin = tmp_path / "polls.cubin"
    shutil.copy(compile_cubin(DATA / "polls.cu", label="polls").path, cubin)
    stale = tmp_path / "polls.sass"
    stale.write_text("// a stale listing of another build: no poll, no spin\n")
    os.utime(stale, (cubin.stat().st_mtime + 100,) * 2)
    proc = hazards("static", "--no-catalog", str(cubin))
    assert proc.returncode == 1 and "[spin-no-load]" in proc.stdout
    assert stale.read_text().startswith("// a stale listing")  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["polls.cubin", "polls.sass"]


# ---- coverage: what a compiled build let the checks see --------------------------------

TWO_LOAD_BLOCK = '''  f4 a, b;
  asm volatile("global_load_dwordx4 %0, %2, off\\n\\tglobal_load_dwordx4 %1, %3, off\\n\\ts_waitcnt vmcnt(0)"
               : "=v"(a), "=v"(b) : "v"(p), "v"(p + N));
  o[0] = a; o[1] = b;
'''
UNCALLED = HEAD + '''typedef float f4 __attribute__((ext_vector_type(4)));
template <int N> __device__ void never_instantiated(const f4* p, f4* o) {
''' + TWO_LOAD_BLOCK + '''}
static __device__ void never_called(const f4* p, f4* o) {
  const int N = 1;
''' + TWO_LOAD_BLOCK + '''}
__device__ int spin(volatile int* f) { while (*f == 0) {} return f[1]; }
__device__ int lanes() { return 64; }
__global__ void k(int* p, volatile int* f) { p[0] = spin(f) + lanes(); }
'''


def _coverage(found) -> str:
    (cov,) = [f.message for f in found if f.check == "coverage"]
    return cov


@requires_hip
def test_a_hazard_in_a_function_never_instantiated_or_called_is_not_analysed_never_a_pass(tmp_path):
    src = tmp_path / "k.hip"
    src.write_text(UNCALLED)
    found = compiled.check_jobs(compiled.jobs_for_files([src], [], ["gfx942"]))
    missed = [(f.check, f.line) for f in found if f.check == "not-analysed"]
    assert missed == [("not-analysed", 3), ("not-analysed", 9)]
    assert "never_instantiated" in found[[f.check for f in found].index("not-analysed")].message
    cov = _coverage(found)
    assert "1 device function(s) compiled, 0 asm block(s) and 1 poll(s) checked" in cov
    assert "not analysed: 2 function(s)" in cov and "1 other function(s) left no code" in cov
    proc = hazards("static", "--compile", str(src), "--arch", "gfx942")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # could not judge: not 0, not "a hazard"
    assert "0 failing finding(s)" in proc.stderr and "coverage: " in proc.stderr


@requires_hip
def test_when_every_function_is_called_the_build_says_what_it_checked_and_passes(tmp_path):
    src = tmp_path / "k.hip"
    called = UNCALLED.replace("p[0] = spin(f) + lanes();",
                              "p[0] = spin(f) + lanes(); never_instantiated<1>((const f4*)p, (f4*)p + 4);"
                              " never_called((const f4*)p, (f4*)p + 8);")
    src.write_text(called.replace('"=v"', '"=&v"'))
    found = compiled.check_jobs(compiled.jobs_for_files([src], [], ["gfx942"]))
    assert not [f for f in found if f.fails]
    assert "1 device function(s) compiled, 2 asm block(s) and 1 poll(s) checked" in _coverage(found)
    assert "not analysed" not in _coverage(found)
    assert hazards("static", "--compile", str(src), "--arch", "gfx942").returncode == 0


@requires_hip
def test_a_function_in_an_inactive_if_branch_is_not_a_function_of_the_build(tmp_path):
    src = tmp_path / "k.hip"
    src.write_text(UNCALLED.replace("template <int N> __device__", "#if 0\ntemplate <int N> __device__")
                   .replace("static __device__ void never_called", "#endif\nstatic __device__ void never_called"))
    found = compiled.check_jobs(compiled.jobs_for_files([src], [], ["gfx942"]))
    assert [f.message.split("`")[1] for f in found if f.check == "not-analysed"] == ["never_called"]


@requires_hip
def test_gfx950_user_builds_are_compiled_by_a_clang_that_targets_it(tmp_path):
    try:
        toolchain.find_tool("clang", arch="gfx950")
    except toolchain.ToolchainMissing as e:
        pytest.skip(str(e))
    src = tmp_path / "k.hip"
    src.write_text(FOUR_LOADS.replace("{C}", "=v").replace("{INIT}", ""))
    found = compiled.check_jobs(compiled.jobs_for_files([src], [], ["gfx950"]))
    assert [f.check for f in found if f.fails] == ["asm-overlap"]
    assert "(gfx950): 1 device function(s) compiled, 1 asm block(s)" in _coverage(found)


@requires_sass
def test_nvidia_builds_report_coverage_and_uncalled_functions_too(tmp_path):
    src = tmp_path / "p.cu"
    src.write_text('''__device__ int spin(volatile int* f) { while (*f == 0) {} return f[1]; }
__device__ int never_called(volatile int* f) { while (*f == 0) {} return f[2]; }
__global__ void k(int* p, volatile int* f) { p[0] = spin(f); }
''')
    found = compiled.check_jobs(compiled.jobs_for_files([src], [], [SM90A]))
    assert [(f.check, f.line) for f in found if f.check == "not-analysed"] == [("not-analysed", 2)]
    assert "(sm_90a): 1 device function(s) compiled, 0 asm block(s) and 1 poll(s) checked" in _coverage(found)


def _two_checkouts(tmp_path, monkeypatch, files: dict[str, str]):
    """Two checkouts of one repository (`main`, `worktree`) holding the same `files` under
    their kernel sources and sharing one build cache; yields each checkout's root while the
    kernel sources and the current folder are its own, as in a process run from it."""
    from hazards.static import compile as compile_mod

    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "cache"))
    for checkout in ("main", "worktree"):
        root = tmp_path / checkout
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        monkeypatch.setattr(compile_mod, "standalone_dir", lambda root=root: root / "standalone")
        monkeypatch.chdir(root)
        yield root


@requires_sass
def test_a_second_checkout_sharing_the_build_cache_gets_findings_at_its_own_files(tmp_path, monkeypatch):
    """The cubin's line table names the checkout it was built in: a second checkout's build of
    the same file (same place, same text) is its own, so its findings are at its own file and
    nothing is `not-analysed` for want of line info naming it."""
    rel = "standalone/common/p.cu"
    for root in _two_checkouts(tmp_path, monkeypatch, {rel: (DATA / "polls_precision.cu").read_text()}):
        found = compiled.check_jobs(compiled.jobs_for_files([Path(rel)], [], [SM90A]))
        failing = [(f.check, f.path) for f in found if f.fails]
        assert failing == [("poll-no-acquire", rel)] * 4, (root.name, failing)
        assert "8 device function(s) compiled" in _coverage(found)


@requires_clang
def test_a_second_checkouts_preprocessed_catalog_source_names_its_own_files(tmp_path, monkeypatch):
    """Preprocessed text (the catalog's lint of a point build) names every file in its line
    markers: a second checkout's text names its own source and header, never the first's."""
    from hazards.static.compile import preprocess

    files = {"standalone/fam/k.hip": '#include "k.h"\nint f() { return K; }\n', "standalone/fam/k.h": "#define K 1\n"}
    for root in _two_checkouts(tmp_path, monkeypatch, files):
        text = preprocess(root / "standalone/fam/k.hip").text
        marked = {m for m in re.findall(r'^# \d+ "([^"<]+)"', text, re.M)}
        assert marked == {str(root / "standalone/fam/k.hip"), str(root / "standalone/fam/k.h")}, marked


@requires_hip
def test_a_relative_include_of_a_compile_command_resolves_against_its_directory(tmp_path):
    proj = tmp_path / "proj"
    (proj / "build").mkdir(parents=True)
    (proj / "pre.h").write_text('#define OUT "=v"\n')
    (proj / "k.hip").write_text(FOUR_LOADS.replace('"{C}"', "OUT").replace("{INIT}", ""))
    db = proj / "build" / "compile_commands.json"
    db.write_text(json.dumps([{"directory": str(proj / "build"), "file": "../k.hip",
                               "command": "hipcc --offload-arch=gfx942 -include ../pre.h -c ../k.hip"}]))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    static = hazards("static", "--compile-commands", str(db), cwd=elsewhere)
    assert static.returncode == 1 and "[asm-overlap]" in static.stdout, static.stdout + static.stderr
    lint = hazards("lint", "--compile-commands", str(db), str(proj / "k.hip"), cwd=elsewhere)
    assert lint.returncode == 1 and "[early-clobber]" in lint.stdout, lint.stdout + lint.stderr


# ---- NVIDIA poll checks: generic loads, inline helpers ------------------------------------

PEER_EXCHANGE = '''struct Peers { int* buf[8]; };
__global__ void exch(Peers peers, volatile int* flag, int* out, int rank) {
  __shared__ int* s_ptr;
  if (threadIdx.x == 0) s_ptr = peers.buf[rank ^ 1];  // a peer's buffer, from the peer table
  __syncthreads();
  while (*flag == 0) {}                                // ld.volatile poll: no acquire
  {FENCE}
  const int* peer = s_ptr;                              // a pointer the compiler cannot place:
  out[threadIdx.x] = peer[threadIdx.x];                 // a generic LD, not an LDG
}
'''


@requires_sass
@pytest.mark.parametrize("fence,flagged", [("", True), ("__threadfence();", False)])
def test_a_generic_load_through_a_peer_pointer_after_a_volatile_poll_is_judged_like_a_global_one(
        tmp_path, fence, flagged):
    found = check(tmp_path, PEER_EXCHANGE.replace("{FENCE}", fence), "p.cu")
    got = [(f.check, f.line) for f in found]
    assert got == ([("poll-no-acquire", 9)] if flagged else [])
    if flagged:
        assert "`LD.E`" in found[0].message  # the generic load, where only LDG was judged before


HELPER_POLLS = '''__device__ __forceinline__ void wait_flag(volatile int* f, int v) { while (*f != v) {} }
__global__ void exch(volatile int* flag, int* out, const int* data) {
  wait_flag(flag, 1);
  out[0] = data[0];
  wait_flag(flag + 1, 2);
  __threadfence();
  out[1] = data[1];
  wait_flag(flag + 2, 3);
  out[2] = data[2];
}
'''


@requires_sass
def test_polls_reached_through_an_inline_helper_are_reported_at_each_call_site(tmp_path):
    src = tmp_path / "h.cu"
    src.write_text(HELPER_POLLS)
    found = compiled.check_jobs(compiled.jobs_for_files([src], [], [SM90A]))
    polls = sorted((f.check, f.line) for f in found if f.check in ("poll-no-acquire", "sync-scope"))
    # the data reads after the first and third call fail; the second call's poll is acquired
    assert polls == [("poll-no-acquire", 4), ("poll-no-acquire", 9), ("sync-scope", 5)]
    assert "inlined from line 1" in next(f.message for f in found if f.check == "sync-scope")
    assert "and 2 more at this line" not in " ".join(f.message for f in found)
    assert "3 poll(s) checked" in _coverage(found) and "not analysed" not in _coverage(found)


OUT_OF_LINE_WAIT = '''__device__ __noinline__ int wait_flag(volatile int* f, int v) {
  int seen;
  while ((seen = *f) < v) {}                           // ld.volatile poll
  {FENCE}
  return seen;
}
__global__ void consume(volatile int* flag, int* out, const int* data) {
  if (threadIdx.x == 0) wait_flag(flag, 1);            // a CALL: the poll is in the callee
  __syncthreads();
  out[threadIdx.x] = data[threadIdx.x];                // the data the flag publishes
}
'''


@requires_sass
@pytest.mark.parametrize("fence,flagged", [("", True), ("__threadfence();", False)])
def test_a_poll_in_an_out_of_line_wait_is_checked_against_what_its_caller_reads_after_it(
        tmp_path, fence, flagged):
    # the tripwire instance's waits go through a __noinline__ function: its poll is reached
    # only by a CALL, and its data is read by the caller after the RET (0 polls checked before)
    src = tmp_path / "w.cu"
    src.write_text(OUT_OF_LINE_WAIT.replace("{FENCE}", fence))
    found = compiled.check_jobs(compiled.jobs_for_files([src], [], [SM90A]))
    assert [(f.check, f.line) for f in found if f.fails] == ([("poll-no-acquire", 10)] if flagged else [])
    (poll,) = [f for f in found if f.check in ("poll-no-acquire", "sync-scope")]
    assert "in out-of-line `_Z9wait_flagPVii`" in poll.message
    assert "1 poll(s) checked" in _coverage(found) and "1 out-of-line function(s)" in _coverage(found)


OUT_OF_LINE_WAIT_HIP = HEAD + '''__attribute__((noinline)) __device__ int wait_flag(int* f, int v) {
  int seen;
  while ((seen = __hip_atomic_load(f, {ORDER}, __HIP_MEMORY_SCOPE_AGENT)) < v) {}
  return seen;
}
__global__ void consume(int* flag, int* out, const int* data) {
  if (threadIdx.x == 0) wait_flag(flag, 1);
  __syncthreads();
  out[threadIdx.x] = data[threadIdx.x];
}
'''


@requires_hip
@pytest.mark.parametrize("order,flagged", [("__ATOMIC_RELAXED", True), ("__ATOMIC_ACQUIRE", False)])
def test_an_amd_out_of_line_wait_that_returns_unacquired_is_flagged_not_passed(tmp_path, order, flagged):
    # its poll was judged "acquire: no data load follows": the walk ended at the return, and the
    # callers' reads (in another function of the listing) were never looked at
    src = tmp_path / "w.hip"
    src.write_text(OUT_OF_LINE_WAIT_HIP.replace("{ORDER}", order))
    found = compiled.check_jobs(compiled.jobs_for_files([src], [], ["gfx942"]))
    assert [(f.check, f.line) for f in found if f.fails] == ([("acquire-missing", 5)] if flagged else [])  # its return
    if not flagged:
        (scope,) = [f for f in found if f.check == "sync-scope"]
        assert "before the return to its callers" in scope.message
    assert "2 device function(s) compiled" in _coverage(found)  # the wait really is out of line


OUT_OF_LINE_READ = '''__device__ __noinline__ void take(const int* data, int* out) { out[threadIdx.x] = data[threadIdx.x]; }
__global__ void consume(volatile int* flag, int* out, const int* data) {
  while (*flag == 0) {}                                // ld.volatile poll: no acquire
  {FENCE}
  take(data, out);                                     // the data is read in the callee
}
'''


@requires_sass
@pytest.mark.parametrize("fence,flagged", [("", True), ("__threadfence();", False)])
def test_data_read_in_an_out_of_line_function_after_a_poll_is_judged_like_data_read_inline(
        tmp_path, fence, flagged):
    found = check(tmp_path, OUT_OF_LINE_READ.replace("{FENCE}", fence), "r.cu")
    assert [(f.check, f.line) for f in found] == ([("poll-no-acquire", 1)] if flagged else [])


LONG_CALLEE_BEFORE_THE_READ = '''__device__ __noinline__ int mix(int x) {
#pragma unroll
  for (int i = 0; i < 60; ++i) x = (x * 31 + (x >> 3)) ^ (i * 0x9e3779b9);
  return x;
}
__global__ void consume(volatile int* flag, int* out, const int* data) {
  while (*flag == 0) {}                                // ld.volatile poll: no acquire
  int k = mix(threadIdx.x);                            // ~200 instructions out of line, no load
  out[threadIdx.x] = data[k & 255];
}
'''


@requires_sass
def test_a_long_out_of_line_call_between_a_poll_and_its_read_does_not_use_up_the_read_window(tmp_path):
    # stepping into the callee counted its ~200 instructions against the 64-instruction window:
    # the read after the call was never reached and the poll passed ("no weak data load follows")
    found = check(tmp_path, LONG_CALLEE_BEFORE_THE_READ, "m.cu")
    assert [f.check for f in found if f.fails] == ["poll-no-acquire"]


OWN_COUNTER = '''struct Signal { unsigned counter[64][8]; unsigned peer[64][8]; };
__global__ void barrier_twice(Signal* self, Signal* const* peers, int rank, float* out, const float* in) {
  for (int round = 0; round < 2; ++round) {
    if (threadIdx.x < 8) {
      unsigned val = self->counter[blockIdx.x][threadIdx.x] += 1;   // this thread's own counter
      ((volatile unsigned*)peers[threadIdx.x]->peer[blockIdx.x])[rank] = val;
      while (((volatile unsigned*)self->peer[blockIdx.x])[threadIdx.x] != val) {}
    }
    __syncthreads();
    {READ}
  }
}
'''


@requires_sass
@pytest.mark.parametrize("read,flagged", [("", False), ("out[threadIdx.x + round] = in[threadIdx.x];", True)])
def test_a_counter_only_its_own_thread_touches_is_not_data_the_poll_publishes(tmp_path, read, flagged):
    # the second round reads the counter again after the first round's poll: that read is
    # the thread's own load-add-store word (flashinfer's vLLM all-reduce barrier), not a stale read;
    # a read of data after the poll still is
    found = check(tmp_path, OWN_COUNTER.replace("{READ}", read), "c.cu")
    assert [f.check for f in found] == (["poll-no-acquire"] if flagged else [])
    if flagged:
        assert found[0].line == 10


OWN_INPUT = '''__global__ void recv(void** buffer_ptrs, int rank, volatile int* flag, int* out) {
  while (*flag == 0) {}
  const int* buf = static_cast<const int*>(buffer_ptrs[{INDEX}]);
  out[threadIdx.x] = buf[56 + rank];
}
'''


@requires_sass
@pytest.mark.parametrize("index,flagged", [("rank", False), ("(rank + 1) % 8", True)])
def test_a_rank_reading_its_own_buffer_after_a_poll_is_not_reading_what_a_peer_published(tmp_path, index, flagged):
    # DeepEP's `buffer_ptrs[rank]` (its own rank_prefix_matrix) vs a peer's entry
    found = check(tmp_path, OWN_INPUT.replace("{INDEX}", index), "o.cu")
    assert [(f.check, f.line) for f in found] == ([("poll-no-acquire", 4)] if flagged else [])


START_BARRIER = '''struct Signal { unsigned counter[64][8]; unsigned peer[64][8]; };  __device__ __noinline__ void put(float* p) { p[threadIdx.x] = 1.f; }
__global__ void start(Signal* self, Signal* const* peers, const float* const* inputs, int rank,
                      float* out, float* scratch) {
  {BEFORE}
  if (threadIdx.x < 8) {
    unsigned val = self->counter[blockIdx.x][threadIdx.x] += 1;         // this thread's own counter
    ((volatile unsigned*)peers[threadIdx.x]->peer[blockIdx.x])[rank] = {ARRIVE};
    while (((volatile unsigned*)self->peer[blockIdx.x])[threadIdx.x] != val) {}
  }
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += inputs[i][threadIdx.x];             // every rank's input
  out[threadIdx.x] = s;
}
'''


@requires_sass
@pytest.mark.parametrize("before,arrive,flagged", [
    ("", "val", False),                                   # vLLM's start barrier: publishes nothing
    ("scratch[threadIdx.x] = 1.f;", "val", True),         # data stored before the arrive: published
    ("", "1u", True),                                     # stores another value than it waits for
    ("scratch[threadIdx.x] += 1.f;", "val", True),        # data read, changed and stored back: published
    ("put(scratch);", "val", True),                       # a call that stores: its stores are elsewhere
])
def test_a_start_barrier_publishes_nothing_written_in_the_kernel(tmp_path, before, arrive, flagged):
    # arrive (store the value) then wait (poll for the same value) in the same code on every
    # rank: what the flag publishes is what the kernel stored before its arrive; with nothing
    # stored, the reads after it are of data written before the launch (flashinfer's vLLM
    # all-reduce `multi_gpu_barrier<ngpus, true>`, whose header says it needs no fence)
    src = tmp_path / "s.cu"
    src.write_text(START_BARRIER.replace("{BEFORE}", before).replace("{ARRIVE}", arrive))
    found = compiled.check_jobs(compiled.jobs_for_files([src], [], [SM90A]))
    errors = [(f.check, f.line) for f in found if f.fails]
    assert errors == ([("poll-no-acquire", 12)] if flagged else [])
    if not flagged:
        (scope,) = [f for f in found if f.check == "sync-scope"]
        assert "start barrier" in scope.message and "before the launch" in scope.message


ROCM6_SOURCE = HEAD + '''#include <hip/hip_bf16.h>
#include <hip/hip_fp8.h>
__global__ void k(const __hip_bfloat162* in, __hip_fp8_e4m3_fnuz* q, float* out, volatile int* flag) {
  __hip_bfloat162 m = __hmax2(in[threadIdx.x], in[threadIdx.x + 64]);   // ROCm 6 bf16 pair maths
  q[threadIdx.x] = __hip_fp8_e4m3_fnuz(__low2float(m));
  __syncwarp();                                                         // HIP 6's warp barrier
  while (*flag == 0) {}
  out[threadIdx.x] = __bfloat162float(__float2bfloat16(__high2float(m)));
}
void launch(hipFunction_t* f) { hipGetFuncBySymbol(f, (const void*)&k); }   // a HIP 6 host API
'''


@requires_hip
def test_rocm6_sources_compile_against_an_older_hip_with_the_projects_stand_ins(tmp_path):
    src = tmp_path / "r6.hip"
    src.write_text(ROCM6_SOURCE)
    for arch in ("gfx942", "gfx950"):
        plain = hazards("static", "--compile", str(src), "--arch", arch)
        assert plain.returncode == 3 and "[compile-failed]" in plain.stdout, plain.stdout + plain.stderr
        compat = hazards("static", "--compile", str(src), "--arch", arch, "--hip6-compat", "-v")
        assert compat.returncode in (0, 1), compat.stdout + compat.stderr
        assert "compile-failed" not in compat.stdout and "1 poll(s) checked" in compat.stdout, compat.stdout


def test_the_rocm6_stand_ins_defer_to_a_real_header_and_take_wheel_headers_last(tmp_path, monkeypatch):
    from hazards.static import userbuild

    compat = userbuild.hip6_compat_args()
    overlay = Path(compat[compat.index("-include") + 1]).parent / "rocm6" / "hip"
    for name in ("hip_bf16.h", "hip_fp8.h"):  # a HIP that has the header (ROCm 6) wins
        assert f"#if __has_include_next(<hip/{name}>)" in (overlay / name).read_text()
    # wheels' headers come after the system's (-idirafter): they never shadow its HIP
    site = tmp_path / "site"
    (site / "triton" / "backends" / "amd" / "include").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    got = userbuild.hip6_compat_args()
    assert f"-idirafter{site / 'triton/backends/amd/include'}" in got
    assert all(a.startswith("-idirafter") for a in got[3:]) and len(got) >= 4


@requires_hip
def test_syncthreads_compiles_to_its_barrier_and_fences_for_gfx950_not_to_a_call(tmp_path):
    # clang 22 no longer links the HIP library of Debian's ROCm 5.2 device libraries, whose
    # __atomic_work_item_fence HIP 5.2's __syncthreads() calls: left a call, the fences were
    # invisible to the release/acquire checks on gfx950 (aiter's quick all-reduce: a false
    # release-order). Both targets must show the barrier and no call.
    from hazards.static.userbuild import hip_device_args

    src = tmp_path / "b.hip"
    src.write_text(HEAD + "__global__ void k(int* p, int* f) { p[threadIdx.x] = 1; __syncthreads(); "
                   "if (threadIdx.x == 0) __hip_atomic_store(f, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT); }\n")
    for arch in ("gfx942", "gfx950"):
        try:
            clang = toolchain.find_tool("clang", arch=arch)
        except ToolchainMissing as e:
            pytest.skip(str(e))
        out = subprocess.run([clang, *hip_device_args(clang, arch), "-O3", "-S", str(src), "-o", "-"],
                             capture_output=True, text=True, check=True).stdout
        assert "s_barrier" in out and "s_swappc_b64" not in out and "__atomic_work_item_fence" not in out, arch


@requires_hip
def test_a_users_rocm_is_used_for_hip_builds_and_a_missing_one_is_a_one_line_error(tmp_path, monkeypatch):
    from hazards.static.userbuild import hip_device_args

    # a ROCm layout (include/, amdgcn/bitcode) made of links to the system's
    rocm = tmp_path / "rocm"
    (rocm / "amdgcn").mkdir(parents=True)
    (rocm / "include").mkdir()
    (rocm / "include" / "hip").symlink_to("/usr/include/hip")
    clang = toolchain.find_tool("clang")
    (flag,) = device_lib_args(clang, "gfx942")  # the system's libraries, with gfx942's ISA library added
    (rocm / "amdgcn" / "bitcode").symlink_to(flag.split("=", 1)[1])
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    assert f"--rocm-path={rocm.resolve()}" in hip_device_args(clang, "gfx942")
    src = tmp_path / "k.hip"
    src.write_text(FOUR_LOADS.replace("{C}", "=v").replace("{INIT}", ""))
    monkeypatch.delenv("ROCM_PATH")
    proc = hazards("static", "--compile", str(src), "--arch", "gfx942", "--rocm-path", str(rocm))
    assert proc.returncode == 1 and "[asm-overlap]" in proc.stdout, proc.stdout + proc.stderr
    (rocm / "amdgcn" / "bitcode").unlink()  # a ROCm without gfx942's libraries: said so, never a pass
    (rocm / "amdgcn" / "bitcode").symlink_to("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")
    old = hazards("static", "--compile", str(src), "--arch", "gfx942", "--rocm-path", str(rocm))
    assert old.returncode == 3 and "[compile-failed]" in old.stdout and "device library for gfx942" in old.stdout
    bad = hazards("static", "--compile", str(src), "--rocm-path", str(tmp_path / "absent"))
    assert bad.returncode == 2 and "--rocm-path" in bad.stderr and "not a folder" in bad.stderr


@requires_hip
def test_a_compile_failure_names_the_compilers_first_error_not_a_quoted_line_or_a_late_one(tmp_path):
    later = "".join(f"__global__ void w{k}(int* p) {{ p[0] = later{k}; }}\n" for k in range(12))  # 36 lines of log
    src = HEAD + '__global__ void k(int* p) { const char* s = "error: not this"; p[0] = nope + *s; }\n' + later
    (f,) = check(tmp_path, src)
    assert f.check == "compile-failed"
    assert "use of undeclared identifier 'nope'" in f.message and "not this" not in f.message


def test_a_hip_compile_command_is_checked_for_the_targets_it_builds(tmp_path):
    src = tmp_path / "k.hip"
    src.write_text("__global__ void k() {}\n")
    db = tmp_path / "compile_commands.json"
    db.write_text(json.dumps([
        {"directory": str(tmp_path), "file": "k.hip",
         "command": "hipcc --offload-arch=gfx950:xnack- --offload-arch gfx942 -c k.hip"},
        {"directory": str(tmp_path), "file": "k.hip", "command": "hipcc -x hip -c k.hip"}]))
    from hazards.static.userbuild import CompileDatabase

    jobs = compiled.jobs_from_database(CompileDatabase.load(db))
    assert [j.arch for j in jobs] == ["gfx950", "gfx942", "gfx942"]
    assert [j.arch for j in compiled.jobs_from_database(CompileDatabase.load(db), archs=["gfx942"])] == ["gfx942"] * 2


def test_an_amd_target_the_checks_do_not_read_is_never_checked_as_itself(tmp_path):
    # gfx90a/gfx1100 spell release and acquire with other bits (glc/slc, buffer_wbinvl1_vol):
    # checked as themselves, a missing release passed unread ("0 failing")
    src = tmp_path / "k.hip"
    src.write_text("__global__ void k() {}\n")
    db = tmp_path / "compile_commands.json"
    db.write_text(json.dumps([{"directory": str(tmp_path), "file": "k.hip",
                               "command": "hipcc --offload-arch=gfx90a --offload-arch=gfx1100:xnack- "
                                          "--offload-arch=gfx950 -c k.hip"}]))
    from hazards.static.userbuild import CompileDatabase

    assert [j.arch for j in compiled.jobs_from_database(CompileDatabase.load(db))] == ["gfx942", "gfx950"]
    with pytest.raises(UserError, match="--arch gfx90a: the AMDGCN checks read gfx942 and gfx950"):
        compiled.jobs_for_files([src], [], ["gfx90a"])
    proc = hazards("static", "--compile", str(src), "--arch", "gfx1100")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


def _probe_isa_library(tool: str, folder: Path) -> object:
    (folder / "oclc_isa_version_940.bc").write_bytes(b"")
    return userbuild._write_isa_library(tool, folder, folder / "oclc_isa_version_942.bc", 9402)


def _probe_hip_library(tool: str, folder: Path) -> object:
    (folder / "hip.bc").write_bytes(b"")
    return userbuild._hip_library_args(tool, [], folder)


USERBUILD_PROBES = {  # each runs the tool `tool` once at least (folder: a scratch folder)
    "compiles": lambda tool, folder: userbuild._compiles(tool, [], ""),
    "hip library": _probe_hip_library,
    "isa library": _probe_isa_library,
    "wavefront size": lambda tool, folder: userbuild.wavefront_size_args.__wrapped__(tool),
    "header compat": lambda tool, folder: userbuild.header_compat_args.__wrapped__(tool),
}


@pytest.mark.parametrize("probe", USERBUILD_PROBES.values(), ids=USERBUILD_PROBES.keys())
def test_abandoning_the_static_part_kills_its_clang_probes(probe, tmp_path, monkeypatch, stray_sleep):
    """The user build's probes of clang and llvm (device libraries, headers, macros) are tools
    of the static part like its compilers: ending the phase (`ToolGroups.kill`, what abandoning
    the static part does) ends them and what they started, instead of leaving them running."""
    fake = tmp_path / "clang"  # a tool that hangs once (a second call, after the kill, fails at once)
    fake.write_text(f"#!/bin/sh\n[ -e {tmp_path}/ran ] && exit 1\ntouch {tmp_path}/ran\n{stray_sleep.command}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(userbuild.toolchain, "find_tool", lambda *a, **k: str(fake))
    in_a_killed_phase(lambda: probe(str(fake), tmp_path), stray_sleep)


def test_a_compiler_that_runs_past_its_time_limit_leaves_no_process_behind(monkeypatch, stray_sleep):
    # nvcc runs cicc, ptxas and gcc under it: the time limit killed only nvcc
    from hazards.engine import toolchain
    from hazards.static.compile import run_tool

    monkeypatch.setattr(toolchain, "COMPILE_TIMEOUT_S", 0.5)
    with pytest.raises(UserError, match="timed out"):
        run_tool(["sh", "-c", stray_sleep.command], "a compile")
    assert not stray_sleep.left(), "the compiler's child outlived the time limit"


@pytest.mark.parametrize("nvcc", ["kill -KILL $$", "sh -c 'kill -KILL $$'; exit $?"], ids=["nvcc", "its child"])
def test_a_user_compile_whose_compiler_was_killed_is_tool_killed_not_a_source_that_did_not_compile(
        nvcc, tmp_path, monkeypatch):
    """The compiled mode's nvcc (or its cicc, ptxas) ended by a signal said nothing about the
    source: a `tool-killed` error (exit 3), not `compile-failed` (which tells the user to fix
    their flags or source)."""
    fake = tmp_path / "nvcc"
    fake.write_text(f"#!/bin/sh\n{nvcc}\n")
    fake.chmod(0o755)
    src = tmp_path / "k.cu"
    src.write_text("#include <cuda_runtime.h>\n__global__ void k(int* p) { p[0] = 1; }\n")
    monkeypatch.setenv("HZ_NVCC", str(fake))
    monkeypatch.setenv("HZ_BUILD_DIR", str(tmp_path / "cache"))
    proc = hazards("static", "--no-catalog", "--compile", str(src))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"{src}: error: [tool-killed] not checked for sm_90a: " in proc.stdout, proc.stdout
    assert "SIGKILL" in proc.stdout and "compile-failed" not in proc.stdout, proc.stdout
