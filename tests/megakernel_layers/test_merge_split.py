"""Campaign step (t) (candidate step_t, -DMKL_MERGE_SPLIT=1 on step 21, production then; production's code since
promote22: step 22 = step 21 + step (t), the default build, turns the switch on): the LSE merge one head a block
(merge_head_split: a head's 16 warps split its chunks, one warp combines their 16 (m, l, acc) from shared
memory) instead of one head a warp (merge_heads, a dependent chain through the head's 33 partials); round 25's
sub-spans (an H100) put the merge at 5.7 us + 1.3 us of arrival a layer while every worker waits for it.

On the CPU (nvcc 13.0, sm_90a): step_t is step 21's switches with MKL_MERGE_SPLIT on and nothing else (and
production's, step 22's, but the step number); mkl_model.h's MERGE_HEADS_PER_WORKER (the one count that
changes) is 1 in that build and in production's, so mkl::merge_workers is 64 at the default shape and 16 at the
small one, still QKV-tile holders, and the Python model follows the build's defines (the schedule, the tripwire
explainer); the step_t build (and production's) calls merge_head_split (a pass of a warp's chunk loads before
its first exponential, the warps' partials to shared memory, one block barrier, the combine's shared loads
after it), step 21's only merge_heads; the compiled static checks count step 21's polls (no wait added or
moved); the catalog names step_t with its two defines. On a GPU (marker gpu): step_t's checked launches clean
on the default, grid-64, small and grid-32 (two heads a merge block) points and its output close to step 21's
(another sum order: not step 21's bits), stale_descriptor still corrupting (production's bits are step_t's:
test_gpu.py).
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from hazards.families import megakernel_layers as F
from hazards.megakernel_layers import faithful as FA
from hazards.megakernel_layers import model as M
from hazards.megakernel_layers.explain import BAR_ATTN_RELEASE, BAR_CHUNK_MERGE
from hazards.kernel_sources import family_dir

from . import bits
from . import test_production_step22 as T22
from .sass_text import function_listings
from .test_merge_spread import ROOT, assert_static_checks_pass_with_the_polls_of, family_cubin, listing_of
from .test_model import DRIVER
from .tripwire_fakes import NO_FEEDER, PHASE_ATTN_MERGE, PHASE_OPROJ, slot, snapshot

STEP_T = {"MKL_CAMPAIGN_STEP": 21, "MKL_MERGE_SPLIT": 1}  # the build gated (candidate step_t): production's code
STEP_21 = {"MKL_CAMPAIGN_STEP": 21}  # step (t)'s base, production from promote21 until step 22
SPLIT_PASS = 4  # mkl_kernel.cuh SPLIT_PASS: chunks a warp loads per pass of merge_head_split


def test_step_t_is_step_21_with_its_switch_alone_and_production_but_the_step_number():
    base, step, prod = T22._switches(STEP_21), T22._switches(STEP_T), T22._switches({})
    assert base["MKL_MERGE_SPLIT"] == 0 and step["MKL_MERGE_SPLIT"] == 1 == prod["MKL_MERGE_SPLIT"]
    assert {k: v for k, v in step.items() if k != "MKL_MERGE_SPLIT"} == \
        {k: v for k, v in base.items() if k != "MKL_MERGE_SPLIT"}
    assert {k for k in step if step[k] != prod[k]} == {"MKL_CAMPAIGN_STEP"}
    assert step["MKL_MERGE_SPREAD"] == 1  # step (t) splits step (d)'s merge workers' heads


def test_the_merge_heads_per_worker_is_the_one_count_the_switch_changes():
    header = (ROOT / "standalone" / "megakernel_layers" / "mkl_model.h").read_text()
    block = header[header.index("#if (defined(MKL_MERGE_SPLIT)"):]
    block = block[:block.index("#endif")]
    assert re.findall(r"constexpr int MERGE_HEADS_PER_WORKER = (\d+);", block) == ["1", "16"]
    assert M.merge_heads_per_worker(None) == M.MERGE_HEADS_PER_WORKER_SPLIT == 1  # production: step 22
    assert M.merge_heads_per_worker(STEP_21) == M.MERGE_HEADS_PER_WORKER == 16
    assert M.merge_heads_per_worker(STEP_T) == 1 and M.merge_heads_per_worker({"MKL_MERGE_SPLIT": 0}) == 16
    # the kernel reads the count through mkl::merge_workers alone (no second count of its own)
    kernel = (ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh").read_text()
    assert kernel.count("merge_workers(s.NQ, p.QT, p.G)") == 1


@pytest.mark.parametrize("workers", [16, 32, 64, 80, 132])
@pytest.mark.parametrize("model", ["default", "small"])
def test_step_t_merge_workers_are_one_a_head_and_hold_qkv_tiles(workers, model):
    p = F.resolve({"model": model})
    sc, base = M.describe(p, workers, STEP_T), M.describe(p, workers, STEP_21)
    n = sc.merge_workers()
    assert base.merge_workers() == -(-sc.shape.NQ // 16)  # step 21's: 4 / 1, step (d)'s
    assert M.describe(p, workers) == sc  # production's schedule is step_t's
    assert n == min(sc.shape.NQ, sc.qkv_tiles, workers)  # a block a head, QKV-tile holders only
    assert all(sc.holds_qkv(w) for w in range(n))  # the snapshot class's vulnerable workers unchanged
    heads = [list(range(w, sc.shape.NQ, n)) for w in range(n)]
    assert sorted(h for hs in heads for h in hs) == list(range(sc.shape.NQ))
    if model == "default" and workers >= 64:
        assert n == 64


def test_the_c_header_counts_step_ts_merge_workers_as_the_model_does(tmp_path):
    cxx = shutil.which("g++") or shutil.which("clang++") or shutil.which("clang++-19")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = tmp_path / "driver.cpp"
    src.write_text(DRIVER)
    exe = tmp_path / "driver"
    subprocess.run([cxx, "-std=c++17", "-O1", "-DMKL_MERGE_SPLIT=1", f"-I{family_dir('megakernel_layers')}",
                    str(src), "-o", str(exe)], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    rows = [[int(x) for x in line.split()[1:]] for line in out.splitlines() if line.startswith("m ")]
    assert rows
    for g, default, small in rows:
        assert [M.schedule(M.SHAPES[m], seq=4096, workers=g, merge_heads=M.merge_heads_per_worker(STEP_T))
                .merge_workers() for m in ("default", "small")] == [default, small]
    assert rows[-1] == [132, 64, 16]


@pytest.fixture(scope="module")
def listings() -> tuple[str, str]:
    """(step 21's SASS listing, step_t's): the harness build's flags (family_cubin)."""
    return (listing_of(family_cubin(STEP_21, "test-mkl-step-21")),
            listing_of(family_cubin(STEP_T, "test-mkl-merge-split")))


def test_step_21_merges_a_head_a_warp_and_step_t_a_head_a_block(listings):
    """(Production's machine code is step_t's line for line: test_production_step22.py.)"""
    prod, step = listings
    assert function_listings(prod, ("merge_heads",)).get("merge_heads")
    assert not function_listings(prod, ("merge_head_split",)).get("merge_head_split")
    assert function_listings(step, ("merge_head_split",)).get("merge_head_split")
    assert not function_listings(step, ("merge_heads",)).get("merge_heads")


def test_step_t_issues_a_warps_chunk_loads_together_then_combines_the_warps_in_shared_memory(listings):
    _, step = listings
    split = function_listings(step, ("merge_head_split",))["merge_head_split"]
    lines = split.splitlines()
    first_ex2 = next(i for i, s in enumerate(lines) if re.search(r"\bMUFU\.EX2\b", s))
    # a pass's (m, l) and output pair of SPLIT_PASS chunks (generic loads in the harness build), all before
    # the pass's first exponential: one L2 round trip a warp at 33 chunks
    loads = [i for i, s in enumerate(lines[:first_ex2]) if re.search(r"\bLDG?\.E\.64\b", s)]
    assert len(loads) >= 2 * SPLIT_PASS, len(loads)
    # the warps' (m, l, acc) stored to shared memory, one block barrier, the combine's shared loads after it
    bar = next(i for i, s in enumerate(lines) if re.search(r"\bBAR\.SYNC\b", s))
    assert any(re.search(r"\bSTS\.64\b", s) for s in lines[first_ex2:bar])
    assert sum(bool(re.search(r"\bLDS(\.64)?\b", s)) for s in lines[bar:]) >= 16  # the 16 warps' partials
    assert any(re.search(r"\bSHFL\.IDX\b", s) for s in lines[bar:])  # warp k's weight from lane k
    # no spill store between the chunk loads and the combine (a spill store waits for its load: round 4's
    # merge_chunks serialised its loads so); the kernel's own spill of its state across the call, at the
    # function's entry, is before the first load
    assert not re.search(r"\bSTL\b", "\n".join(lines[loads[0]:bar]))


def test_step_t_passes_the_compiled_static_checks_with_step_21s_polls():
    assert_static_checks_pass_with_the_polls_of(["-DMKL_CAMPAIGN_STEP=21", "-DMKL_MERGE_SPLIT=1"], 21)


def test_step_t_participant_set_hang_names_its_64_merge_workers_and_the_missing_chunks():
    """Step (t) at seq 16384 (129 chunks, 80 QKV tiles): its 64 merge workers wait for the chunk count at
    CHUNK_MERGE, the other 68 at ATTN_RELEASE; the explainer reads the schedule of the build's defines."""
    sl = [slot(w, layer=0, phase=PHASE_ATTN_MERGE, barrier=BAR_CHUNK_MERGE, observed=80, expected=129,
               aux=(80, 129, NO_FEEDER)) for w in range(64)]
    sl += [slot(w, layer=0, phase=PHASE_OPROJ, barrier=BAR_ATTN_RELEASE, observed=0, expected=1,
                aux=(80, 129, NO_FEEDER)) for w in range(64, 132)]
    text = F.explain_hang(snapshot(132, sl), {"variant": "participant_set"}, STEP_T)
    assert "68 of 132 workers wait at ATTN_RELEASE in layer 0 (epoch 1) and 64 at CHUNK_MERGE" in text
    assert "CHUNK_MERGE counted 80 of its 129" in text and "chunk ranks 80–128 never arrived" in text


def test_the_harness_checks_the_merge_workers_hold_qkv_tiles():
    host = (ROOT / "standalone" / "megakernel_layers" / "megakernel_layers.cu").read_text()
    assert "if (merge_workers(u.s.NQ, u.QT, u.G) > std::min(u.QT, u.G))" in host


def test_the_catalog_names_step_t_on_step_21_with_its_switch_alone():
    c = FA.candidate("step_t")
    assert dict(c.defines) == STEP_T and c.params == ()
    assert "prediction" in c.what and "measured: faster twice, promoted" in c.what
    assert c.expected == "no-change"  # against production, step 22, its own code


@pytest.mark.gpu
@pytest.mark.parametrize("params", [
    {"layers": 2, "seq": 4096},                                   # 33 chunks: warp 0 takes 3, the others 2
    {"layers": 2, "seq": 16384},                                  # 129 chunks: warp 0 takes 3 passes (the rescale)
    {"layers": 2, "seq": 1024, "grid": 64, "chunks": 64},         # 64 workers, 64 chunks: 4 a warp, 64 mergers
    {"layers": 2, "seq": 1024, "model": "small"},                 # 16 heads, 16 merge workers, 9 chunks (idle warps)
    {"layers": 2, "seq": 1024, "grid": 32},                       # 32 merge workers: two heads a block, one after another
    {"layers": 2, "seq": 1024, "hazard": "stale_descriptor"},     # the stale KV and W2 pointers still corrupt
], ids=["default", "seq16384", "grid64", "small", "grid32", "stale_descriptor"])
def test_step_t_is_clean_and_close_to_step_21(params: dict):
    """Step (t) sums a head's chunks in another order than step 21, its base (16 warps' partial sums, then their
    combine): not step 21's bits, but every checked launch clean against the binary's reference
    (corrupted, with stale_descriptor on) and the output close to step 21's: cos > 0.99999, the largest
    difference under 2e-3 of step 21's largest value, the family's relative error under a quarter of
    its tolerance. (Production, step 22, is step_t's code: its bits are step_t's, test_gpu.py.)"""
    out, out_p = bits.checked_outputs(STEP_T, STEP_21, params, corrupting="hazard" in params)
    if "hazard" not in params:
        bits.assert_close(out, out_p)

