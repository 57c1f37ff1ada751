"""AMDGCN release/acquire and the NVIDIA SASS checks, on real compiler output."""
from __future__ import annotations

import pytest

from hazards.static import amdgcn, amdgcn_isa, amdgcn_sync, sass
from hazards.static.compile import compile_amdgcn, compile_cubin
from static_helpers import DATA, listing, requires_clang, requires_nvdisasm, sass_listing


@pytest.fixture(scope="module")
def amd_sync():
    build = compile_amdgcn(DATA / "sync.hip", label="sync")
    funcs = {f.name: f for f in amdgcn_isa.parse_listing(build.text)}
    return {name: amdgcn_sync.check_sync([f], "sync.s") for name, f in funcs.items()}


def _one(amd_sync, name):
    (key,) = [k for k in amd_sync if name in k]
    return amd_sync[key]


@requires_clang
def test_system_release_with_writeback_is_clean_and_its_scope_is_said(amd_sync):
    found = _one(amd_sync, "release_system_ok")
    assert not [f for f in found if f.fails]
    (info,) = [f for f in found if f.check == "sync-scope"]
    assert "system-scope release" in info.message and "buffer_wbl2 sc0 sc1" in info.message


@requires_clang
def test_write_through_flag_after_a_barrier_only_is_flagged(amd_sync):
    found = _one(amd_sync, "release_barrier_only")
    assert {f.check for f in found if f.fails} == {"release-order"}


@requires_clang
def test_agent_acquire_is_clean_and_named(amd_sync):
    found = _one(amd_sync, "acquire_agent_ok")
    assert not [f for f in found if f.fails]
    assert any("agent-scope acquire" in f.message for f in found)


@requires_clang
@pytest.mark.parametrize("name,bad", [("poll_relaxed_no_acquire", True), ("poll_then_fence_ok", False)])
def test_poll_followed_by_plain_load_needs_buffer_inv(amd_sync, name, bad):
    found = _one(amd_sync, name)
    assert ({f.check for f in found if f.fails} == {"acquire-missing"}) is bad
    assert bad or not [f for f in found if f.fails]


def test_release_scope_mismatch_on_a_minimal_listing():
    body = """
global_store_dword v0, v1, s[0:1]
s_waitcnt vmcnt(0)
global_store_dword v0, v1, s[2:3] sc0 sc1
"""
    found = amdgcn.check_listing(listing(body), "t.s")
    assert {f.check for f in found if f.fails} == {"release-scope"}
    fixed = body.replace("s_waitcnt vmcnt(0)", "buffer_wbl2 sc1\ns_waitcnt vmcnt(0)")
    assert not [f for f in amdgcn.check_listing(listing(fixed), "t.s") if f.fails]


def test_a_search_nested_in_a_loop_and_a_private_array_are_not_polls():
    # aiter's topk_softmax: the inner loop walks `indices[row + prior_k]` (s[20:21] += 4), the
    # outer loop's exit depends on what it found; its address is reset before the inner loop,
    # so only the inner loop's own update shows it is not one flag re-read
    body = """
s_mov_b32 s27, 0
.LBB0_1:
s_mov_b64 s[20:21], s[42:43]
.LBB0_2:
global_load_dword v11, v5, s[20:21]
s_add_i32 s27, s27, 1
s_add_u32 s20, s20, 4
s_addc_u32 s21, s21, 0
s_cmp_ge_u32 s27, s17
s_waitcnt vmcnt(0)
v_cmp_eq_u32_e32 vcc, v11, v8
v_cndmask_b32_e32 v9, v9, v6, vcc
s_cbranch_scc0 .LBB0_2
v_cmp_ngt_f32_e32 vcc, v6, v9
s_and_saveexec_b64 s[54:55], vcc
s_cbranch_execz .LBB0_1
global_load_dwordx4 v[4:7], v1, s[18:19]
"""
    found = amdgcn.check_listing(listing(body), "t.s")
    assert not [f for f in found if f.fails]
    # the same outer loop re-reading one flag is a poll, and the load after it needs an acquire
    poll = body.replace("s_add_u32 s20, s20, 4\ns_addc_u32 s21, s21, 0\n", "")
    assert {f.check for f in amdgcn.check_listing(listing(poll), "t.s") if f.fails} == {"acquire-missing"}
    # a thread's private array re-read in a loop (topk_softmax's row_chunk, spilled to scratch)
    # is no agent's flag: not a poll
    private = poll.replace("global_load_dword v11, v5, s[20:21]", "scratch_load_dword v11, off, off")
    assert not [f for f in amdgcn.check_listing(listing(private), "t.s") if f.fails]


def test_a_nontemporal_data_store_is_not_a_flag():
    # aiter's quick all-reduce stores its quantized data and scales with
    # __builtin_nontemporal_store (`nt`); only the sc1 / write-through store or an atomic is a flag
    body = """
global_store_byte v0, v1, s[0:1]
global_store_dword v0, v2, s[2:3] nt
s_waitcnt vmcnt(0)
buffer_wbl2 sc1
global_store_dword v0, v3, s[4:5] sc0 sc1
"""
    assert not [f for f in amdgcn.check_listing(listing(body), "t.s") if f.fails]


def test_a_generic_pointer_that_is_global_memory_on_one_branch_keeps_its_flag_checked():
    # the flat store's high dword is src_shared_base on one branch and a kernel argument on
    # the other: on that path it is a write-through flag to global memory after a data store
    body = """
global_store_dword v0, v1, s[0:1]
s_cmp_eq_u32 s4, 0
s_cbranch_scc1 .LBB0_2
v_mov_b32 v9, s3
v_mov_b32 v8, s2
s_branch .LBB0_3
.LBB0_2:
s_mov_b64 s[6:7], src_shared_base
v_mov_b32 v9, s7
v_mov_b32 v8, 0
.LBB0_3:
flat_store_dword v[8:9], v2 sc0 sc1
s_endpgm
"""
    assert "release-order" in {f.check for f in amdgcn.check_listing(listing(body), "t.s") if f.fails}
    # LDS on both branches: a store to this block's shared memory, no flag
    both = body.replace("v_mov_b32 v9, s3", "s_mov_b64 s[10:11], src_shared_base\nv_mov_b32 v9, s11")
    assert not [f for f in amdgcn.check_listing(listing(both), "t.s") if f.fails]


_START_BARRIER = """
v_mov_b32 v6, s2
flat_store_dword v[4:5], v6 sc0 sc1
.LBB0_2:
global_load_dword v3, v[0:1], off sc1
s_waitcnt vmcnt(0)
v_cmp_le_u32_e32 vcc, s2, v3
s_or_b64 s[0:1], vcc, s[0:1]
s_andn2_b64 exec, exec, s[0:1]
s_cbranch_execnz .LBB0_2
s_or_b64 exec, exec, s[12:13]
s_barrier
global_load_dwordx4 v[8:11], v3, s[8:9]
global_store_dword v3, v8, s[10:11]
s_endpgm
"""
_CALL = "s_swappc_b64 s[30:31], s[16:17]\n"


def _sync(body):
    found = amdgcn.check_listing(listing(body), "t.s")
    return {f.check for f in found if f.fails}, " ".join(f.message for f in found if f.check == "sync-scope")


def test_a_call_before_a_start_barriers_arrive_may_store_what_it_publishes():
    # aiter's start_sync: the arrive stores the value waited for and nothing is stored before
    # it, so no acquire; a call before the arrive may store anything (its body is elsewhere)
    fails, said = _sync(_START_BARRIER)
    assert fails == set() and "a start barrier" in said
    called = _START_BARRIER.replace("v_mov_b32 v6, s2\n", _CALL + "v_mov_b32 v6, s2\n")
    assert _sync(called)[0] == {"acquire-missing"}


@pytest.mark.parametrize("after_wait,flagged", [
    ("", False),  # nothing read after the wait: the arrive of a final barrier, no release needed
    (_CALL, True),  # a call after the wait may read what peers published
    ("global_atomic_add v7, v3, v9, s[8:9] sc0\n", True),  # an atomic that returns what it read
    ("global_atomic_add v3, v9, s[8:9]\n", False),  # one that returns nothing reads nothing back
])
def test_a_final_barrier_is_one_after_whose_wait_nothing_is_read(after_wait, flagged):
    final = _START_BARRIER.replace("global_load_dwordx4 v[8:11], v3, s[8:9]\nglobal_store_dword v3, v8, s[10:11]\n",
                                   "").replace("v_mov_b32 v6, s2\n", "global_store_dword v3, v9, s[10:11]\n"
                                               "v_mov_b32 v6, s2\n").replace("s_barrier\n", "s_barrier\n" + after_wait)
    fails, said = _sync(final)
    assert ("release-order" in fails) is flagged, (fails, said)
    assert ("the arrive of a final barrier" in said) is not flagged


@pytest.fixture(scope="module")
def polls_sass():
    build = compile_cubin(DATA / "polls.cu", label="polls")
    return sass.check_cubin(build.path)


@requires_nvdisasm
@pytest.mark.parametrize("check, kernel", [
    ("spin-no-load", "spin_plain_flag_hangs"),  # a spin on a plain flag: a certain hang
    ("poll-no-acquire", "spin_volatile_no_acquire"),  # a volatile poll, then plain loads, no acquire
])
def test_the_one_finding_of_a_poll_check_names_its_broken_kernel(polls_sass, check, kernel):
    (f,) = [f for f in polls_sass if f.check == check]
    assert kernel in f.message


@requires_nvdisasm
def test_mbarrier_try_wait_loop_is_a_memory_poll_not_a_spin(polls_sass):
    spins = " ".join(f.message for f in polls_sass if f.check == "spin-no-load")
    assert "spin_plain_flag_hangs" in spins and "mbarrier_try_wait_loop_ok" not in spins


@requires_nvdisasm
def test_acquire_load_and_fence_after_poll_are_clean(polls_sass):
    notes = [f.message for f in polls_sass if f.check == "sync-scope"]
    assert any("spin_acquire_ok" in m and "CCTL.IVALL" in m for m in notes)
    assert any("spin_volatile_then_fence_ok" in m and "MEMBAR" in m for m in notes)
    flagged = " ".join(f.message for f in polls_sass if f.fails)
    assert "_ok" not in flagged and "counted_loop" not in flagged


@requires_nvdisasm
@pytest.mark.parametrize("serial", [True, False])
def test_ptxas_wgmma_serialization_is_a_performance_finding(serial):
    found = sass.compile_and_check(DATA / "wgmma.cu", defines={"HZ_SERIAL": 1} if serial else {},
                                   label=f"wgmma-{serial}")
    perf = [f for f in found if f.check == "wgmma-serialized"]
    assert bool(perf) is serial
    assert all(f.severity == "perf" and not f.fails for f in perf)


SASS_SPIN = """
//--------------------- .text.k --------------------------
.text.k:
        /*0000*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0010*/                   ISETP.NE.AND P0, PT, R2, RZ, PT ;
        /*0020*/              @!P0 BRA `(.L_x_1) ;
        /*0030*/                   EXIT ;
.L_x_1:
        /*0040*/                   BRA `(.L_x_1) ;
.L_x_2:
        /*0050*/                   BRA `(.L_x_2);
"""


def test_sass_parser_flags_a_reachable_self_loop_and_ignores_the_padding_loop():
    (f,) = [f for f in sass.check_sass(SASS_SPIN, "k.sass") if f.fails]
    assert f.check == "spin-no-load" and "/*0040*/" in f.message


def test_sass_loop_with_a_changing_exit_is_not_a_spin():
    text = SASS_SPIN.replace("        /*0040*/                   BRA `(.L_x_1) ;",
                             "        /*0038*/                   IADD3 R2, R2, 0x1, RZ ;\n"
                             "        /*003c*/                   ISETP.NE.AND P0, PT, R2, RZ, PT ;\n"
                             "        /*0040*/              @!P0 BRA `(.L_x_1) ;\n"
                             "        /*0048*/                   EXIT ;")
    assert not [f for f in sass.check_sass(text, "k.sass") if f.fails]


OUT_OF_LINE_EARLY_RETURN = """
CALL.REL.NOINC `($k$wait)
LDG.E R6, desc[UR4][R8.64]
STG.E desc[UR4][R10.64], R6
EXIT
.L_x_0:
BRA `(.L_x_0)
$k$wait:
.L_x_1:
LD.E.STRONG.SYS R0, [R4.64]
ISETP.GE.AND P0, PT, R0, R5, PT
@!P0 BRA `(.L_x_1)
ISETP.NE.AND P1, PT, R7, RZ, PT
{before}
{guard} RET.REL.NODEC R20 `(k)
{tail}
RET.REL.NODEC R20 `(k)
"""


@pytest.mark.parametrize("before,guard,tail,stale", [
    ("NOP", "@P1", "CCTL.IVALL", "at /*0010*/ follows the poll"),  # the early return reaches the caller's read unacquired
    ("NOP", "@!P1", "LDG.E R9, desc[UR4][R12.64]", "(+1 more such loads)"),  # and still falls through
    ("CCTL.IVALL", "@P1", "NOP", None),  # acquired before the early return: both ways are
])
def test_a_predicated_ret_after_a_poll_returns_to_the_callers_and_falls_through(before, guard, tail, stale):
    # an out-of-line wait that returns early on one predicate: a predicated RET returned only by
    # its fall-through, so the caller's LDG after the early return was never reached (the poll
    # passed on the fence of the other path)
    text = sass_listing(OUT_OF_LINE_EARLY_RETURN.format(before=before, guard=guard, tail=tail))
    found = sass.check_sass(text, "k.sass")
    errors = [f.message for f in found if f.fails]
    if stale is None:
        assert errors == [] and "CCTL.IVALL" in " ".join(f.message for f in found if f.check == "sync-scope")
    else:
        assert [f.check for f in found if f.fails] == ["poll-no-acquire"]
        assert "at /*0010*/ follows the poll" in errors[0] and stale in errors[0], errors[0]


# --- precision of the poll checks on real nvcc output --------------------------------------

@pytest.fixture(scope="module")
def precision_sass():
    build = compile_cubin(DATA / "polls_precision.cu", label="polls-precision")
    found = sass.check_cubin(build.path)
    by_kernel: dict[str, list] = {}
    for f in found:
        kernel = f.message.split(":", 1)[0]
        by_kernel.setdefault(kernel.split("_Z", 1)[-1], []).append(f)
    return by_kernel


def _errors(by_kernel, name):
    (key,) = [k for k in by_kernel if name in k] or [None]
    return [f for f in by_kernel.get(key, []) if f.fails]


@requires_nvdisasm
@pytest.mark.parametrize("kernel", ["pointer_table_poll_flagged", "all_sync_poll_flagged",
                                    "block_fence_after_poll_flagged", "many_reads_one_finding_flagged"])
def test_a_data_read_after_a_poll_without_acquire_is_flagged_once(precision_sass, kernel):
    (f,) = _errors(precision_sass, kernel)
    assert f.check == "poll-no-acquire" and "follows the poll `LDG.E.STRONG.SYS`" in f.message


@requires_nvdisasm
def test_the_poll_is_the_load_of_the_flag_not_of_its_address(precision_sass):
    (f,) = _errors(precision_sass, "pointer_table_poll_flagged")
    assert "LDG.E.64" not in f.message  # the pointer-table load is not named as the poll


@requires_nvdisasm
def test_one_finding_names_how_many_more_reads_there_were(precision_sass):
    (f,) = _errors(precision_sass, "many_reads_one_finding_flagged")
    assert "more such loads" in f.message


@requires_nvdisasm
@pytest.mark.parametrize("kernel", ["gpu_fence_after_poll_ok", "credit_poll_then_own_input_ok",
                                    "search_loop_is_not_a_poll_ok", "local_memory_loop_is_not_a_poll_ok"])
def test_acquired_credit_search_and_local_loops_give_no_error(precision_sass, kernel):
    assert _errors(precision_sass, kernel) == []


@requires_clang
@pytest.mark.parametrize("name,expected", [
    ("arrival_after_barrier_flagged", {"release-order"}), ("arrival_after_fence_ok", set()),
    ("histogram_counter_ok", set()), ("reduction_loop_is_not_a_poll_ok", set()),
    ("search_loop_is_not_a_poll_ok", set()),
])
def test_amd_arrivals_counters_reductions_and_searches(amd_sync, name, expected):
    assert {f.check for f in _one(amd_sync, name) if f.fails} == expected


@requires_clang
@pytest.mark.parametrize("name,expected,said", [
    # aiter's all-reduce barriers: an arrive of the value waited for, nothing stored before it
    ("start_barrier_ok", set(), "a start barrier"),
    ("start_barrier_after_a_store_flagged", {"acquire-missing", "release-scope"}, None),
    # nothing read after the wait: the arrive publishes nothing another rank reads
    ("final_barrier_ok", set(), "the arrive of a final barrier"),
    ("middle_barrier_flagged", {"acquire-missing", "release-scope"}, None),
    # scratch (a thread's private memory) is never data a flag publishes
    ("private_array_around_flags_ok", set(), None),
    # volatile LDS stores through a generic pointer (flat ... sc0 sc1) are not flags
    ("volatile_lds_through_a_pointer_ok", set(), None),
])
def test_amd_start_and_final_barriers_private_memory_and_lds_through_a_pointer(amd_sync, name, expected, said):
    found = _one(amd_sync, name)
    assert {f.check for f in found if f.fails} == expected
    if said:
        assert any(said in f.message for f in found if f.check == "sync-scope")


@requires_clang
def test_loops_that_walk_addresses_are_not_polls():
    build = compile_amdgcn(DATA / "sync.hip", label="sync")
    polls = {f.name: amdgcn_sync.poll_loops(f) for f in amdgcn_isa.parse_listing(build.text)}
    assert all(not loops for name, loops in polls.items() if "is_not_a_poll" in name)
    assert any(loops for name, loops in polls.items() if "poll_relaxed" in name)
