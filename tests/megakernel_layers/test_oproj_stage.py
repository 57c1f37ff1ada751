"""Campaign step (u) (candidate step_u, -DMKL_OPROJ_STAGE=1 on production: written on step 21, on step 22 since
promote22; step_u16 with 16 rows staged; step_t_u stacked on step (t)'s build, step 21 with -DMKL_MERGE_SPLIT=1,
step_u's code since step 22): a worker's O-projection rows copied into its shared memory by bulk copies on an mbarrier,
issued where production issues their L2 prefetch (before the merge), so they land while it waits for
ATTN_RELEASE; after the wait the GEMV (gemv_block_staged) reads them with ld.shared instead of three dependent L2
rounds (round 25's sub-spans, an H100: the O-projection's gemv 7.0 us a layer, on the layer head's chain).

On the CPU (nvcc 13.0, sm_90a): step_u is production's switches with MKL_OPROJ_STAGE on and nothing else; the
build's PTX issues the bulk copies (one a row, on the stage's mbarrier, after every thread's proxy fence) and
production's none; its SASS has gemv_round_staged with shared loads of the stage, the L2 path's loads for the
groups not staged, and no spill; the shared memory the block asks for at both shapes (and the catalog's numbers)
from the compiled header; the stage covers every row of a worker at the default shape on 132 workers; the
compiled static checks count production's polls (no wait added or moved) and the Python model (who waits where,
the explainer) is production's in this build; the catalog names step_u, step_u16 and step_t_u with their
defines and predictions. On a GPU (marker gpu): production's bits on the default, three-layer (the mbarrier's
phase parity wraps), grid-64 and grid-32 (rows past the stage from L2), small and gemv_depth-1 points,
stale_descriptor still corrupting; step_u16 production's bits; step_t_u step_t's bits (production's code).
The negative control (CONTROL_U: -DMKL_STAGE_CONTROL_NO_COPY=1, a test-only switch, not a candidate): on the CPU
its PTX issues no bulk copy, poisons the stage and arrives without a transaction, and keeps step_u's shared loads;
on a GPU it does not give production's bits (so the bit tests above see the staged path, not only its sums).
"""
from __future__ import annotations

import re
import subprocess

import pytest

from hazards.families import megakernel_layers as F
from hazards.megakernel_layers import faithful as FA
from hazards.megakernel_layers import model as M
from hazards.megakernel_layers.explain import BAR_ATTN_RELEASE, BAR_CHUNK_MERGE

from . import bits
from . import test_production_step22 as T22
from .sass_text import function_listings
from .test_merge_spread import INCLUDE, LAYERED, ROOT, assert_static_checks_pass_with_the_polls_of, family_cubin, listing_of
from .tripwire_fakes import NO_FEEDER, PHASE_ATTN_MERGE, PHASE_OPROJ, slot, snapshot

STEP_U = {"MKL_OPROJ_STAGE": 1}
STEP_U16 = {"MKL_OPROJ_STAGE": 1, "MKL_OPROJ_STAGE_ROWS": 16}
STEP_T = {"MKL_CAMPAIGN_STEP": 21, "MKL_MERGE_SPLIT": 1}  # candidate step_t: production's code since step 22
STEP_T_U = {**STEP_T, **STEP_U}
# the negative control (not a candidate): step_u's reads of the stage, no copies into it (MKL_STAGE_CONTROL_NO_COPY)
CONTROL_U = {"MKL_OPROJ_STAGE": 1, "MKL_STAGE_CONTROL_NO_COPY": 1}
KERNEL = ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh"
BULK_COPY = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
PROXY_FENCE = "fence.proxy.async.shared::cta"


def _stage_rows_default() -> int:
    return int(re.search(r"#define MKL_OPROJ_STAGE_ROWS (\d+)", KERNEL.read_text()).group(1))


def test_step_u_is_production_with_its_switch_alone():
    prod, step = T22._switches({}), T22._switches(STEP_U)
    assert prod["MKL_OPROJ_STAGE"] == 0 and step["MKL_OPROJ_STAGE"] == 1
    assert {k: v for k, v in step.items() if k != "MKL_OPROJ_STAGE"} == \
        {k: v for k, v in prod.items() if k != "MKL_OPROJ_STAGE"}
    # written on production's O-projection: step (d)'s prefetch place, step (l)'s copy (the kernel's static_assert)
    assert step["MKL_MERGE_SPREAD"] == 1 and step["MKL_COPY_AHEAD"] == 1 and step["MKL_HEAD_AHEAD"] == 0


@pytest.mark.parametrize("model", ["default", "small"])
def test_the_stage_holds_every_row_of_a_worker_on_132_workers(model):
    p = F.resolve({"model": model})
    sc = M.describe(p, 132, STEP_U)
    rows = [M.row_begin(w + 1, sc.row_workers, sc.shape.D) - M.row_begin(w, sc.row_workers, sc.shape.D)
            for w in range(sc.row_workers)]
    assert max(rows) <= _stage_rows_default()
    if model == "default":
        assert max(rows) == _stage_rows_default() == 22  # 2880 rows on 132 workers: 21 or 22 a worker


@pytest.mark.parametrize("workers", [16, 32, 64, 132])
@pytest.mark.parametrize("model", ["default", "small"])
def test_the_python_model_is_productions_in_step_us_build(workers, model):
    """No wait on another worker added or moved: the schedule (who waits where) of step_u's and step_t_u's
    builds are production's and step_t's."""
    p = F.resolve({"model": model})
    assert M.describe(p, workers, STEP_U) == M.describe(p, workers)
    assert M.describe(p, workers, STEP_T_U) == M.describe(p, workers, STEP_T)
    assert M.describe(p, workers, STEP_T_U) == M.describe(p, workers, STEP_U)  # production has step (t) since step 22


def test_the_explainer_reads_step_us_build_as_productions():
    sl = [slot(w, layer=0, phase=PHASE_ATTN_MERGE, barrier=BAR_CHUNK_MERGE, observed=80, expected=129,
               aux=(80, 129, NO_FEEDER)) for w in range(4)]
    sl += [slot(w, layer=0, phase=PHASE_OPROJ, barrier=BAR_ATTN_RELEASE, observed=0, expected=1,
                aux=(80, 129, NO_FEEDER)) for w in range(4, 132)]
    snap = snapshot(132, sl)
    text = F.explain_hang(snap, {"variant": "participant_set"}, STEP_U)
    assert text == F.explain_hang(snap, {"variant": "participant_set"}, None)
    assert "128 of 132 workers wait at ATTN_RELEASE in layer 0 (epoch 1) and 4 at CHUNK_MERGE" in text


def _ptx(defines: dict | None, label: str) -> str:
    from hazards.engine.errors import ToolchainMissing
    from hazards.static.compile import compile_ptx

    try:
        return compile_ptx(LAYERED, defines=defines, label=label, extra_args=(f"-I{INCLUDE}",)).text
    except ToolchainMissing as e:
        pytest.skip(f"cannot build the family's PTX: {e}")


@pytest.fixture(scope="module")
def ptxs() -> tuple[str, str]:
    return _ptx(None, "test-mkl-ptx-prod-u"), _ptx(STEP_U, "test-mkl-ptx-oproj-stage")


def _func(ptx: str, name: str) -> str:
    """The body of the PTX function whose mangled name contains `name` (its one definition)."""
    bodies = [m.group(0) for m in re.finditer(r"\.func[^\n]*" + re.escape(name) + r"[^{;]*\{.*?\n}\n", ptx, flags=re.S)]
    assert len(bodies) == 1, (name, len(bodies))
    return bodies[0]


def _assert_issued_before_the_wait(ptx: str) -> None:
    """Both kernel instances (the tripwire's and the plain one): the stage's mbarrier initialised once, the issue
    (the call) before the O-projection's wait on the stage."""
    entries = re.findall(r"\.entry[^\n]*mkl_megakernel.*?\n}\n", ptx, flags=re.S)
    assert len(entries) == 2
    for body in entries:
        assert body.count("mbarrier.init.shared") == 1
        assert body.index("oproj_stage_issue") < body.index("mbarrier.try_wait.parity")


def test_step_u_issues_a_bulk_copy_a_row_after_a_proxy_fence_and_production_none(ptxs):
    prod, step = ptxs
    for op in (BULK_COPY, PROXY_FENCE, "mbarrier.try_wait.parity", "gemv_round_staged", "oproj_stage_issue"):
        assert op not in prod, op
    # oproj_stage_issue (out of line): every thread's proxy fence, a block barrier, then thread 0's expect_tx
    # and a loop of bulk copies, one a row, on the stage's mbarrier
    issue = _func(step, "oproj_stage_issue")
    at = [issue.index(op) for op in (PROXY_FENCE, "bar.sync", "mbarrier.arrive.expect_tx", BULK_COPY)]
    assert at == sorted(at), at  # (nvcc unrolls the row loop: several copies of the instruction)
    _assert_issued_before_the_wait(step)


ARRIVE_NO_TX = "mbarrier.arrive.shared::cta.b64"  # an arrival without a transaction (not arrive.expect_tx)


def assert_poisons_the_stage_then_arrives(control: str, step: str, name: str, stores: int) -> None:
    """The negative control's PTX (MKL_STAGE_CONTROL_NO_COPY; `step`: the step's): no bulk copy and no transaction
    anywhere; its stage issue (function `name`): the step's proxy fence and block barrier, then `stores` loops of
    the block's stores of all ones (0xFF: bf16 NaN) into the stage, a block barrier, and thread 0's arrival without
    a transaction (the step has none), last."""
    assert BULK_COPY not in control and "expect_tx" not in control and ARRIVE_NO_TX not in step
    issue = _func(control, name)
    assert "cp.async.bulk" not in issue
    ones = set(re.findall(r"mov\.u32\s+(%r\d+), -1;", issue))
    poison = [m.start() for m in re.finditer(r"st\.shared\.v4\.u32\s+\[[^\]]+\], \{(%r\d+), \1, \1, \1\};", issue)
              if m.group(1) in ones]
    assert len(poison) == stores, poison
    fence, arrive = issue.index(PROXY_FENCE), issue.index(ARRIVE_NO_TX)
    assert fence < issue.index("bar.sync", fence) < poison[0]
    assert poison[-1] < issue.index("bar.sync", poison[-1]) < arrive and issue.count(ARRIVE_NO_TX) == 1


@pytest.fixture(scope="module")
def control_ptx() -> str:
    return _ptx(CONTROL_U, "test-mkl-ptx-oproj-stage-control")


def test_the_negative_control_keeps_step_us_reads_and_issues_no_copy(ptxs, control_ptx):
    """The GPU tests' negative control (-DMKL_STAGE_CONTROL_NO_COPY=1 on step_u): no bulk copy anywhere; the issue
    poisons the rows the copies would have written and arrives without a transaction (the wait has nothing left to
    wait for: no hang); the kernel still waits on the stage's mbarrier after issuing, and gemv_round_staged reads
    the stage with step_u's shared loads."""
    step = ptxs[1]
    assert_poisons_the_stage_then_arrives(control_ptx, step, "oproj_stage_issue", 1)
    _assert_issued_before_the_wait(control_ptx)
    for depth in ("gemv_round_stagedILi4E", "gemv_round_stagedILi1E"):
        reads = _func(control_ptx, depth).count("ld.shared.v4.u32")
        assert reads == _func(step, depth).count("ld.shared.v4.u32") and reads >= 4, (depth, reads)


def test_the_copies_follow_productions_two_prefetches_of_wo_and_the_router_rows():
    """Production's `if (...) Wo's prefetch else if (...) the router rows'` chain is whole: the stage's issue
    comes after it (inside it, the router rows' `else` would have bound to the issue's `if`)."""
    text = KERNEL.read_text()
    chain = text.index("    else if (r1 > r0 && tid >= 32 && tid < 64 && w < s.E)  // the router's rows")
    issue = text.index("    if (r1 > r0) oproj_stage_issue(hd, s.NQ, r0, r1);")
    assert chain < issue and text.count("oproj_stage_issue(hd,") == 1
    between = text[chain:issue]
    assert "prefetch_l2(dptr<__nv_bfloat16>(hd, SLOT_ROUTER)" in between and "#if MKL_OPROJ_STAGE" in between


@pytest.fixture(scope="module")
def listings() -> tuple[str, str]:
    """(production's SASS listing, step_u's): the harness build's flags (family_cubin)."""
    return (listing_of(family_cubin(None, "test-mkl-step-default")),
            listing_of(family_cubin(STEP_U, "test-mkl-oproj-stage")))


def test_step_u_reads_the_stage_with_shared_loads_and_the_rest_from_l2(listings):
    prod, step = listings
    assert not function_listings(prod, ("gemv_round_staged",)).get("gemv_round_staged")
    staged = function_listings(step, ("gemv_round_staged",))["gemv_round_staged"]
    lds = len(re.findall(r"\bLDS\.128\b", staged))
    ldg = len(re.findall(r"\bLDG\.E\.NA\.128\.CONSTANT\b", staged))
    # the stage's 4 rows x 4 iterations (depth 4) plus depth 1's 4, the act's float4 pairs: all LDS, no generic
    # LD.E (a generic load of shared memory); the groups past the stage: production's no-allocate loads
    assert lds >= 4 * 4 + 4 and ldg >= 4 * 4 + 4, (lds, ldg)
    assert not re.search(r"\bLD\.E\b", staged)
    # no spill store; one reload at a copy's entry (an argument: two depths, each cloned per kernel instance)
    assert not re.search(r"\bSTL\b", staged) and len(re.findall(r"\bLDL\b", staged)) <= 4
    # the kernel body issues bulk copies (UBLKCP) and waits on an mbarrier (SYNCS); production's does neither
    assert re.search(r"\bUBLKCP\b", step) and not re.search(r"\bUBLKCP\b", prod)
    assert re.search(r"\bSYNCS\.PHASECHK\b", step) and not re.search(r"\bSYNCS\.PHASECHK\b", prod)


PROBE = """#include "megakernel_layers/mkl_kernel.cuh"
#include <cstdio>
int main() { std::printf("%zu %zu\\n", mkl::smem_bytes(mkl::SHAPE_DEFAULT), mkl::smem_bytes(mkl::SHAPE_SMALL)); }
"""


def _probe(tmp_path, defines: dict | None) -> tuple[subprocess.CompletedProcess, object]:
    """PROBE compiled with `defines` (the build's result, the executable): what the kernel's header asks for."""
    from hazards.engine import toolchain
    from hazards.engine.errors import ToolchainMissing

    try:
        nvcc = str(toolchain.find_tool("nvcc", needed_for="the shared-memory probe"))
    except ToolchainMissing as e:
        pytest.skip(f"no nvcc: {e}")
    tag = "_".join(f"{k}{v}" for k, v in (defines or {}).items()) or "prod"
    src, exe = tmp_path / "probe.cu", tmp_path / f"probe_{tag}"
    src.write_text(PROBE)
    standalone = ROOT / "standalone"
    flags = [f"-D{k}={v}" for k, v in (defines or {}).items()]
    return subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", *flags, f"-I{standalone}", f"-I{INCLUDE}",
                           f"-I{standalone / 'megakernel_layers'}", str(src), "-o", str(exe)],
                          capture_output=True, text=True), exe


def _smem_bytes(tmp_path, defines: dict | None) -> tuple[int, int]:
    """The dynamic shared memory a block asks for at the default and the small shape, with `defines`."""
    built, exe = _probe(tmp_path, defines)
    assert built.returncode == 0, built.stderr
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1])


def test_the_shared_memory_each_build_asks_for_and_the_catalog_says(tmp_path):
    prod, step, step16 = (_smem_bytes(tmp_path, d) for d in (None, STEP_U, STEP_U16))
    limit = 227 * 1024
    assert all(b <= limit for b in (*prod, *step, *step16))
    # the default shape's stage: 22 (16) rows of 4096 bf16 from 2 NQ * HD floats of the arena on; the small
    # shape's 22 (16) rows of 1024 bf16
    head = step[0] - 2 * 64 * 64 * 4 - 22 * 64 * 64 * 2
    assert step16[0] == head + 2 * 64 * 64 * 4 + 16 * 64 * 64 * 2
    assert step[1] == head + 2 * 16 * 64 * 4 + 22 * 16 * 64 * 2
    # the carve-out: production's block fits the 64-KB configuration, step_u's only the 228-KB one (L1 28 KB),
    # step_u16's the 164-KB one (L1 92 KB); 1 KB a block reserved by the system
    assert prod[0] + 1024 <= 64 * 1024 and 196 * 1024 < step[0] + 1024 <= 228 * 1024
    assert 132 * 1024 < step16[0] + 1024 <= 164 * 1024
    what = FA.candidate("step_u").what
    assert f"{step[0]:,} B of shared memory, not {prod[0]:,}" in what
    assert f"{step16[0]:,} B" in FA.candidate("step_u16").what


def test_step_u_passes_the_compiled_static_checks_with_productions_polls():
    assert_static_checks_pass_with_the_polls_of(["-DMKL_OPROJ_STAGE=1"], [])


def test_the_catalog_names_step_u_its_16_row_point_and_the_stack_with_step_t():
    for name, defines in (("step_u", STEP_U), ("step_u16", STEP_U16), ("step_t_u", STEP_T_U)):
        c = FA.candidate(name)
        assert dict(c.defines) == defines and c.params == (), name
        assert "Prediction, written before any run" in c.what and c.expected == "slower", name
        assert ("Measured (the seventeenth session" if name != "step_t_u" else "Not gated") in c.what, name


@pytest.mark.gpu
@pytest.mark.parametrize("params", [
    {"layers": 2, "seq": 4096},                                 # 22 rows a worker, all staged
    {"layers": 3, "seq": 1024},                                 # the stage's mbarrier parity 0, 1, 0
    {"layers": 2, "seq": 1024, "grid": 64},                     # 45 rows: 5 groups staged, the rest from L2
    {"layers": 2, "seq": 1024, "grid": 32},                     # 90 rows: 5 groups staged, 18 from L2
    {"layers": 2, "seq": 1024, "model": "small"},               # 7-8 rows of 1024 bf16
    {"layers": 2, "seq": 1024, "gemv_depth": 1},                # gemv_round_staged<1>
    {"layers": 2, "seq": 1024, "hazard": "stale_descriptor"},   # the stale KV and W2 pointers still corrupt
], ids=["default", "layers3", "grid64", "grid32", "small", "depth1", "stale_descriptor"])
def test_step_u_gives_productions_bits(params: dict):
    """Step (u) reads the same weights into the same sums in the same order: production's bits on every point
    (corrupted in both, with stale_descriptor on)."""
    bits.assert_same_bits(STEP_U, None, params)


@pytest.mark.gpu
def test_the_negative_control_does_not_give_productions_bits():
    """The bit tests above see the staged path: step_u's build with MKL_STAGE_CONTROL_NO_COPY (its reads of the
    stage, no copies into it: the stage's rows hold 0xFF, bf16 NaN) does not give production's bits at the
    default point. A build whose staged reads were compiled out (or fell back to L2) would, and fail here."""
    bits.assert_not_same_bits(CONTROL_U, None, {"layers": 2, "seq": 4096})


@pytest.mark.gpu
def test_step_u16_gives_productions_bits():
    bits.assert_same_bits(STEP_U16, None, {"layers": 2, "seq": 4096})


@pytest.mark.gpu
def test_step_t_u_gives_step_ts_bits():
    bits.assert_same_bits(STEP_T_U, STEP_T, {"layers": 2, "seq": 4096})
