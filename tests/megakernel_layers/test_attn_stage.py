"""Campaign step (v) (candidate step_v, -DMKL_ATTN_STAGE=1 on production; step_v_k with K alone staged; step_u_v
stacked with step (u)): an attention chunk's K rows (its first 128 tokens) and its first V blocks copied into the
chunk worker's shared memory by bulk copies on an mbarrier, issued at layer entry where production issues the
chunk's K/V L2 prefetch, so they land during its QKV tile and its QKV_EPOCH wait; the block loop
(attend_blocks_mma) then reads a staged block's K (and V) words with ld.shared in production's fragment layout
(the fifteenth session's sub-spans, an H100: the loop 8.5 us a layer, two dependent L2 round trips a block).

On the CPU (nvcc 13.0, sm_90a): step_v is production's switches with MKL_ATTN_STAGE on and nothing else; its PTX
issues two bulk copies (K, V) after every thread's proxy fence and a block barrier (attn_stage_issue, called
before the QKV tiles), and the kernel waits on the stage's mbarrier before attend_chunk; production's PTX has
none of it; the SASS of attend_chunk reads the stage with LDS.128 (K's 8 and V's 8 words a lane and block, on top
of production's q reads) and keeps the L2 path's loads for blocks past the stage, with no spill store; the shared
memory each build asks for (and the catalog's numbers); the compile-time rejection of a stage that cannot fit;
the stage covers every chunk of the default and the small shape at seq 4096 on 132 workers; the compiled static
checks count production's polls and the Python model (who waits where) is production's; the catalog names step_v,
step_v_k and step_u_v with their defines and predictions. On a GPU (marker gpu): production's bits (the same
values reach the same mma in the same order) on the default, three-layer (the mbarrier's parity wraps), grid-64,
grid-32 (129-token chunks: the block past the stage, the new token's among them, from L2), long-chunk (512
tokens), small and gemv_depth-1 points, stale_descriptor still corrupting; step_v_k and step_u_v
production's bits. The negative control (CONTROL_V: -DMKL_STAGE_CONTROL_NO_COPY=1, a test-only switch, not a
candidate): on the CPU its PTX issues no bulk copy, poisons the K and V rows and arrives without a transaction,
and keeps step_v's shared loads; its build (and step (u)'s control's) compiles with the step's shared memory, and
not without a stage; it is in no catalog and no campaign script; on a GPU it does not give production's bits (so
the bit tests above see the staged path, not only its sums).
"""
from __future__ import annotations

import re

import pytest

from hazards.families import megakernel_layers as F
from hazards.megakernel_layers import faithful as FA
from hazards.megakernel_layers import model as M

from . import bits
from . import test_production_step22 as T22
from .sass_text import function_listings, spills_by_function
from .test_merge_spread import LAYERED, ROOT, assert_static_checks_pass_with_the_polls_of, family_cubin, listing_of
from .test_oproj_stage import (BULK_COPY, CONTROL_U, PROXY_FENCE, _func, _probe, _ptx, _smem_bytes,
                               assert_poisons_the_stage_then_arrives)

STEP_V = {"MKL_ATTN_STAGE": 1}
STEP_V_K = {"MKL_ATTN_STAGE": 1, "MKL_ATTN_STAGE_V_BLOCKS": 0}
STEP_U = {"MKL_OPROJ_STAGE": 1}
STEP_U_V = {**STEP_U, **STEP_V}
# the negative control (not a candidate): step_v's reads of the stage, no copies into it (MKL_STAGE_CONTROL_NO_COPY)
CONTROL_V = {"MKL_ATTN_STAGE": 1, "MKL_STAGE_CONTROL_NO_COPY": 1}
CONTROL = "MKL_STAGE_CONTROL_NO_COPY"
KERNEL = ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh"


def test_step_v_is_production_with_its_switch_alone():
    prod, step = T22._switches({}), T22._switches(STEP_V)
    assert prod["MKL_ATTN_STAGE"] == 0 and step["MKL_ATTN_STAGE"] == 1
    assert {k: v for k, v in step.items() if k != "MKL_ATTN_STAGE"} == \
        {k: v for k, v in prod.items() if k != "MKL_ATTN_STAGE"}
    # written on production's chunk: step (m)'s loop, step (l)'s q copy and its barrier, not step (q)'s lean chunk
    assert step["MKL_ATTN_MMA"] == 1 and step["MKL_COPY_AHEAD"] == 1 and step["MKL_CHUNK_LEAN"] == 0


@pytest.mark.parametrize("model", ["default", "small"])
def test_the_stage_holds_every_chunk_at_seq_4096_on_132_workers(model):
    """At the family's defaults (seq 4096, chunk_tokens 128) every chunk has at most 128 tokens: its K wholly from
    the stage (MKL_ATTN_STAGE_K_BLOCKS 4)."""
    p = F.resolve({"model": model})
    sc = M.describe(p, 132, STEP_V)
    sizes = [b - a for a, b in map(sc.chunk_tokens, range(sc.chunks))]
    assert sc.chunks == 33 and max(sizes) <= 128
    assert int(re.search(r"#define MKL_ATTN_STAGE_K_BLOCKS (\d+)", KERNEL.read_text()).group(1)) * 32 == 128


@pytest.mark.parametrize("workers", [16, 32, 64, 132])
@pytest.mark.parametrize("model", ["default", "small"])
def test_the_python_model_is_productions_in_step_vs_build(workers, model):
    """No wait on another worker added or moved: the schedule (who waits where) of step_v's and step_u_v's builds
    are production's and step_u's."""
    p = F.resolve({"model": model})
    assert M.describe(p, workers, STEP_V) == M.describe(p, workers)
    assert M.describe(p, workers, STEP_U_V) == M.describe(p, workers, STEP_U)


@pytest.fixture(scope="module")
def ptxs() -> tuple[str, str]:
    return _ptx(None, "test-mkl-ptx-prod-v"), _ptx(STEP_V, "test-mkl-ptx-attn-stage")


def _assert_issued_at_layer_entry_and_waited_before_the_chunk(ptx: str) -> None:
    """Both kernel instances: the stage's mbarrier initialised once; the issue (the call) before the QKV tiles'
    GEMV, and every thread's wait on the stage before attend_chunk's call."""
    entries = re.findall(r"\.entry[^\n]*mkl_megakernel.*?\n}\n", ptx, flags=re.S)
    assert len(entries) == 2
    for body in entries:
        assert body.count("mbarrier.init.shared") == 1
        call = body.index("attn_stage_issue")
        assert call < body.index("gemv_round") and call < body.index("mbarrier.try_wait.parity")
        assert body.index("mbarrier.try_wait.parity") < body.index("attend_chunk")


def test_step_v_issues_two_bulk_copies_at_layer_entry_and_production_none(ptxs):
    prod, step = ptxs
    for op in (BULK_COPY, PROXY_FENCE, "mbarrier.try_wait.parity", "attn_stage_issue"):
        assert op not in prod, op
    # attn_stage_issue (out of line): every thread's proxy fence, a block barrier, then thread 0's expect_tx and
    # two bulk copies (K's rows, V's rows) on the stage's mbarrier
    issue = _func(step, "attn_stage_issue")
    at = [issue.index(op) for op in (PROXY_FENCE, "bar.sync", "mbarrier.arrive.expect_tx", BULK_COPY)]
    assert at == sorted(at), at
    assert issue.count(BULK_COPY) == 2
    _assert_issued_at_layer_entry_and_waited_before_the_chunk(step)
    # attend_chunk reads the stage with ld.shared (K's and V's words) and stores the new token's row into it
    chunk = _func(step, "attend_chunkILi8ELi8E")
    assert chunk.count("ld.shared.v4.u32") >= 16 and "st.shared.v4.u32" in chunk
    assert "ld.shared.v4.u32" not in _func(prod, "attend_chunkILi8ELi8E")


@pytest.fixture(scope="module")
def control_ptx() -> str:
    return _ptx(CONTROL_V, "test-mkl-ptx-attn-stage-control")


def test_the_negative_control_keeps_step_vs_reads_and_issues_no_copy(ptxs, control_ptx):
    """The GPU tests' negative control (-DMKL_STAGE_CONTROL_NO_COPY=1 on step_v): no bulk copy anywhere; the issue
    poisons the K rows and the V rows the two copies would have written and arrives without a transaction (the
    wait has nothing left to wait for: no hang); the kernel still issues before the QKV tiles and waits on the
    stage's mbarrier before attend_chunk, and attend_chunk (both groupings) reads the stage with step_v's shared
    loads and stores the new token's row into it."""
    step = ptxs[1]
    assert_poisons_the_stage_then_arrives(control_ptx, step, "attn_stage_issue", 2)
    _assert_issued_at_layer_entry_and_waited_before_the_chunk(control_ptx)
    for grouping in ("attend_chunkILi8ELi8E", "attend_chunkILi4ELi4E"):
        chunk, step_chunk = _func(control_ptx, grouping), _func(step, grouping)
        for op in ("ld.shared.v4.u32", "st.shared.v4.u32"):
            assert chunk.count(op) == step_chunk.count(op), (grouping, op)
        assert chunk.count("ld.shared.v4.u32") >= 16


def _assert_control_builds(defines: dict, label: str, issue: str) -> None:
    """A negative control's harness build (the harness's flags, through ptxas) compiles, its stage issue spilling
    nothing."""
    spills = spills_by_function(family_cubin(defines, label, "-Xptxas=-v").log)
    assert [spills[k] for k in spills if issue in k] == [(0, 0)], spills


def test_the_negative_controls_build_with_their_steps_shared_memory_and_not_without_a_stage(tmp_path):
    """Steps (v)'s and (u)'s controls' harness builds compile (their issues spilling nothing) and ask for their
    steps' shared memory; on without a stage (production's build: nothing withheld, a control of nothing) the
    build fails with its message."""
    for control, step, issue in ((CONTROL_V, STEP_V, "attn_stage_issue"), (CONTROL_U, STEP_U, "oproj_stage_issue")):
        _assert_control_builds(control, f"test-mkl-{issue}-control", issue)
        assert _smem_bytes(tmp_path, control) == _smem_bytes(tmp_path, step), control
    built, _ = _probe(tmp_path, {CONTROL: 1})
    assert built.returncode != 0
    assert f"{CONTROL} (the staged path's negative control) needs MKL_OPROJ_STAGE or MKL_ATTN_STAGE" in built.stderr


def test_the_negative_control_is_off_by_default_and_no_campaign_switch_nor_candidate():
    """A test-only switch: 0 unless -D; not in test_production_step22's SWITCHES (the campaign's switches), in no
    catalog candidate's defines, and no GPU script but the GPU tests' prebuild (final-gpu-tests.sh) builds it."""
    assert f"#ifndef {CONTROL}\n#define {CONTROL} 0\n#endif\n" in KERNEL.read_text()
    assert CONTROL not in T22.SWITCHES
    assert not [c.name for c in FA.CANDIDATES.values() if CONTROL in dict(c.defines)]
    scripts = [f.name for f in sorted((ROOT / "ci" / "gpu").iterdir()) if f.is_file() and CONTROL in f.read_text()]
    assert scripts == ["final-gpu-tests.sh"], scripts


def test_the_stage_is_issued_after_productions_kv_prefetch():
    text = KERNEL.read_text()
    prefetch = text.index("      prefetch_l2(dptr<__nv_bfloat16>(hd, tid < 32 ? SLOT_KCACHE : SLOT_VCACHE)")
    issue = text.index("    if (chunk_worker && t1 > t0) attn_stage_issue(hd, s.NQ, s.NKV, t0, t1, p.seq);")
    qkv = text.index("    // ---- QKV tiles ---")
    assert prefetch < issue < qkv and text.count("attn_stage_issue(hd,") == 1


@pytest.fixture(scope="module")
def listings() -> tuple[str, str]:
    """(production's SASS listing, step_v's): the harness build's flags (family_cubin)."""
    return (listing_of(family_cubin(None, "test-mkl-step-default")),
            listing_of(family_cubin(STEP_V, "test-mkl-attn-stage")))


def test_step_v_reads_the_stage_with_shared_loads_and_the_rest_from_l2(listings):
    prod, step = listings
    pc = function_listings(prod, ("attend_chunk",))["attend_chunk"]
    sc = function_listings(step, ("attend_chunk",))["attend_chunk"]
    copies = len(re.findall(r"^\S*attend_chunk\S*:\s*$", sc, flags=re.M)) or 4  # 2 groupings x 2 kernel instances
    lds = lambda s: len(re.findall(r"\bLDS\.128\b", s))  # noqa: E731
    ldg = lambda s: len(re.findall(r"\bLDG\.E[.\w]*\.128\b", s))  # noqa: E731
    # K's 8 and V's 8 16-B words a lane and block from the stage, on top of production's q reads
    assert lds(sc) >= lds(pc) + 16 * 4, (lds(sc), lds(pc), copies)
    # the blocks past the stage: production's L2 loads (K's 8, V's 8 a lane), plus the new token's row
    assert ldg(sc) >= ldg(pc), (ldg(sc), ldg(pc))
    assert not re.search(r"\bLD\.E\b", sc) and not re.search(r"\bSTL\b", sc)
    # K's words in the odd lanes' order put back by selects (8 a token pair, 4 n-tiles): the loads stay per-lane
    # addressed, conflict-free (ptxas did not fold the selects into the addresses)
    sel = lambda s: len(re.findall(r"\bSEL\b", s))  # noqa: E731
    assert sel(sc) >= sel(pc) + 32 * 4, (sel(sc), sel(pc))
    # the issue (bulk copies: UBLKCP) and the wait (SYNCS); production has neither
    assert re.search(r"\bUBLKCP\b", step) and not re.search(r"\bUBLKCP\b", prod)
    assert re.search(r"\bSYNCS\.PHASECHK\b", step) and not re.search(r"\bSYNCS\.PHASECHK\b", prod)


def test_attend_chunk_spills_no_more_than_productions():
    """ptxas -v from canonical_sources: attend_chunk (both groupings) and the issue spill no more than production's
    attend_chunk (nvcc 13.0: 0 / 12 B both). The plain kernel body's spills are reported in the catalog, not
    bounded here (410 / 1,476 B against 406 / 1,440 on step 21, 430 / 1,500 against 422 / 1,460 on step 22: the
    body's allocation moves with any change)."""
    base = spills_by_function(family_cubin(None, "test-mkl-prod-canon-v", "-Xptxas=-v", canonical=True).log)
    step = spills_by_function(family_cubin(STEP_V, "test-mkl-attn-stage-canon-v", "-Xptxas=-v", canonical=True).log)
    chunks = [k for k in base if "attend_chunk" in k]
    assert len(chunks) == 2
    for k in chunks:
        [sk] = [s for s in step if s.startswith(k[:k.index("S7_") + 3])]
        assert step[sk][0] <= base[k][0] and step[sk][1] <= base[k][1], (k, base[k], step[sk])
    [issue] = [k for k in step if "attn_stage_issue" in k]
    assert step[issue] == (0, 0)


def test_the_shared_memory_each_build_asks_for_and_the_catalog_says(tmp_path):
    prod, step, step_k, step_u, step_uv = (_smem_bytes(tmp_path, d) for d in (None, STEP_V, STEP_V_K, STEP_U, STEP_U_V))
    limit = 227 * 1024
    assert all(b <= limit for b in (*prod, *step, *step_k, *step_uv))
    # the stage from NQ * HD floats of the arena on: K's 128 tokens of NKV * HD bf16, then V's 64 (default: two
    # blocks fit, not three) or 128 (small)
    head = step[0] - 64 * 64 * 4 - (128 + 64) * 8 * 64 * 2
    assert step[1] == head + 16 * 64 * 4 + (128 + 128) * 4 * 64 * 2
    assert step_k[0] == head + 64 * 64 * 4 + 128 * 8 * 64 * 2
    assert limit - step[0] < 32 * 8 * 64 * 2  # a third V block would not fit
    # stacked with step (u): the two stages share the arena (they end at the same byte at the default shape)
    assert step_uv == (max(step[0], step_u[0]), max(step[1], step_u[1])) and step[0] == step_u[0]
    # the carve-out: step_v's block fits only the 228-KB configuration (L1 28 KB), step_v_k's the 164-KB one
    assert 196 * 1024 < step[0] + 1024 <= 228 * 1024 and 132 * 1024 < step_k[0] + 1024 <= 164 * 1024
    assert f"{step[0]:,} B of shared memory, not {prod[0]:,}" in FA.candidate("step_v").what
    assert f"{step_k[0]:,} B" in FA.candidate("step_v_k").what
    assert f"{step_uv[0]:,} B" in FA.candidate("step_u_v").what


def test_a_stage_that_cannot_fit_is_rejected_at_compile_time(tmp_path):
    """8 blocks of K (256 KB at the default shape) cannot fit a block's 227 KB: the build fails with the stage's
    message, not with a launch error on the GPU."""
    built, _ = _probe(tmp_path, {"MKL_ATTN_STAGE": 1, "MKL_ATTN_STAGE_K_BLOCKS": 8})
    assert built.returncode != 0
    assert "step (v): the K rows of MKL_ATTN_STAGE_K_BLOCKS blocks (32 tokens each) do not fit" in built.stderr


def test_step_v_passes_the_compiled_static_checks_with_productions_polls():
    assert_static_checks_pass_with_the_polls_of(["-DMKL_ATTN_STAGE=1"], [])


def test_step_u_v_passes_the_compiled_static_checks_with_productions_polls():
    assert_static_checks_pass_with_the_polls_of(["-DMKL_ATTN_STAGE=1", "-DMKL_OPROJ_STAGE=1"], [])


def test_the_catalog_names_step_v_its_k_only_point_and_the_stack_with_step_u():
    for name, defines in (("step_v", STEP_V), ("step_v_k", STEP_V_K), ("step_u_v", STEP_U_V)):
        c = FA.candidate(name)
        assert dict(c.defines) == defines and c.params == (), name
        assert "Prediction, written before any run" in c.what and "Revised before any run" in c.what, name
        assert c.expected == {"step_v": "slower", "step_v_k": "slower", "step_u_v": "slower"}[name], name


@pytest.mark.gpu
@pytest.mark.parametrize("params", [
    {"layers": 2, "seq": 4096},                                 # 33 chunks of 124-125 tokens, all staged
    {"layers": 3, "seq": 1024},                                 # the stage's mbarrier parity 0, 1, 0
    {"layers": 2, "seq": 4096, "grid": 64},                     # 33 chunks on 64 workers
    {"layers": 2, "seq": 4096, "grid": 32},                     # 32 chunks of 128-129: a block past the stage
    {"layers": 2, "seq": 8192, "chunks": 16},                   # 512-token chunks: 12 of 16 blocks from L2
    {"layers": 2, "seq": 1000},                                 # 8 chunks, a partial last block
    {"layers": 2, "seq": 4096, "model": "small"},               # GQ = 4: K and V of 128 tokens staged
    {"layers": 2, "seq": 1024, "gemv_depth": 1},
    {"layers": 2, "seq": 1024, "hazard": "stale_descriptor"},   # the stale KV pointers still corrupt
], ids=["default", "layers3", "grid64", "grid32", "long_chunks", "seq1000", "small", "depth1", "stale_descriptor"])
def test_step_v_gives_productions_bits(params: dict):
    """Step (v) reads the same K and V words into the same mma in the same order: production's bits on every point
    (corrupted in both, with stale_descriptor on)."""
    bits.assert_same_bits(STEP_V, None, params)


@pytest.mark.gpu
def test_the_negative_control_does_not_give_productions_bits():
    """The bit tests above see the staged path: step_v's build with MKL_STAGE_CONTROL_NO_COPY (its reads of the
    stage, no copies into it: the staged K and V rows hold 0xFF, bf16 NaN) does not give production's bits at the
    default point (33 chunks, all staged). A build whose staged reads were compiled out (or fell back to L2)
    would, and fail here."""
    bits.assert_not_same_bits(CONTROL_V, None, {"layers": 2, "seq": 4096})


@pytest.mark.gpu
def test_step_v_k_gives_productions_bits():
    bits.assert_same_bits(STEP_V_K, None, {"layers": 2, "seq": 4096})


@pytest.mark.gpu
@pytest.mark.parametrize("params", [{"layers": 3, "seq": 4096}, {"layers": 2, "seq": 4096, "grid": 32}],
                         ids=["layers3", "grid32"])
def test_step_u_v_gives_productions_bits(params: dict):
    """Steps (u) and (v) stacked: both stages in the same bytes, one after the other, every layer."""
    bits.assert_same_bits(STEP_U_V, None, params)
