"""Family `megakernel_layers` on the CPU: the static model, the strategy, the tripwire
explainer (on synthetic snapshots) and the static checks on the sync layer's gfx942 code."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings

from hazards.families import get_family
from hazards.families import megakernel_layers as F
from hazards.megakernel_layers import model as M

from .tripwire_fakes import NO_FEEDER, PHASE_ATTN_CHUNK, PHASE_MOE_W2, PHASE_OPROJ, PHASE_ROUTING_WAIT, slot, snapshot

FAM = get_family("megakernel_layers")


@pytest.mark.parametrize("variant", [v.name for v in FAM.variants])
def test_every_canary_is_hazardous_and_every_clean_variant_is_not(variant):
    v = FAM.variant(variant)
    assert F.static_model({"variant": variant}).hazardous is v.is_canary


def test_one_canary_per_hazard_class_and_every_class_has_one():
    assert sorted(F.resolve({"variant": v.name})["hazard"] for v in FAM.canaries) == sorted(M.HAZARDS[1:])


@pytest.mark.parametrize("seq, hangs", [(4096, False), (10239, False), (10240, True), (16384, True)])
def test_participant_set_hangs_once_the_chunks_outnumber_the_qkv_tiles(seq, hangs):
    # auto chunks = ceil((seq + 1) / 128); 80 QKV tiles
    pr = F.predict({"variant": "participant_set", "seq": seq})
    assert (pr.outcome == "hang") is hangs, pr
    assert F.predict({"variant": "clean", "seq": seq}).outcome == "clean"


def test_chunk_supply_hangs_only_without_the_guard_and_above_the_workers():
    assert F.predict({"variant": "chunk_supply"}).outcome == "hang"
    assert F.predict({"variant": "chunk_supply", "chunks": 64}).outcome == "clean"
    assert F.predict({"variant": "clean", "grid": 64, "chunks": 80}).outcome == "rejected"


def test_snapshot_epoch_rate_grows_with_skew_and_needs_a_long_enough_delay():
    base = {"variant": "snapshot_epoch"}
    rates = [F.predict({**base, "jitter_ppm": q}).probability for q in (0, 200, 2000, 20000)]
    assert rates[0] == 0 and rates == sorted(rates) and 0 < rates[2] < 1
    assert F.predict({**base, "jitter_cycles": 1000}).probability == 0     # 0.5 us: shorter than the layer head
    assert F.predict({**base, "layers": 1}).outcome == "clean"
    # every worker holds a QKV tile (grid 80): no worker can snapshot after the bump
    assert F.predict({**base, "grid": 80}).outcome == "clean"
    # the same skew on the fixed kernel predicts nothing
    assert F.predict({"variant": "clean_skew"}).outcome == "clean"


def test_snapshot_epoch_hangs_only_when_the_late_worker_skews_alone():
    # 52 of 132 workers hold no QKV tile and no chunk; the 80 that do delay the bump when they
    # stall at the same boundary, so the late snapshot then still comes first
    base = {"variant": "snapshot_epoch"}
    q = 2000 / 1e6
    per_boundary = (1 - (1 - q) ** 52) * (1 - q) ** 80
    assert F.predict(base).probability == pytest.approx(1 - (1 - per_boundary) ** 3)
    # so far more skew makes the hang rarer, not likelier
    assert F.predict({**base, "jitter_ppm": 200000}).probability < F.predict({**base, "jitter_ppm": 20000}).probability


def test_deterministic_corruptions_need_a_second_layer_or_a_tail():
    assert F.predict({"variant": "stale_descriptor"}).probability == 1.0
    for name in ("stale_release", "stale_descriptor"):
        assert F.predict({"variant": name, "layers": 1}).outcome == "clean"
    assert F.predict({"variant": "amax_tail"}).outcome == "mismatch"
    assert F.predict({"variant": "amax_tail", "model": "small"}).outcome == "clean"
    assert F.predict({"variant": "dead_flag", "layers": 1}).probability == 1.0


def test_shared_line_hang_rate_follows_the_emulated_write_back():
    assert F.predict({"variant": "shared_line"}).probability == 1.0
    assert F.predict({"variant": "shared_line", "writeback_ppm": 0}).outcome == "clean"
    p = F.predict({"variant": "shared_line", "writeback_ppm": 10000}).probability
    assert p == pytest.approx(1 - 0.99 ** 16)
    # the emulated write-back runs on the fixed layout too, and cannot revert anything there
    assert F.predict({"variant": "clean", "writeback_ppm": 1000000}).outcome == "clean"


def test_stale_release_shows_when_a_w13_tile_starts_late():
    pr = F.predict({"variant": "stale_release"})
    assert pr.outcome == "mismatch" and pr.probability > 0   # 2000 ppm over 132 tiles x 3 layers
    assert F.predict({"variant": "stale_release", "jitter_ppm": 0}).outcome == "clean"  # tile order hides it


@pytest.mark.parametrize("cycles, mismatched, launches", [(200_000, 91, 1960), (1_000_000, 35, 560)])
def test_stale_release_rate_is_the_mismatch_rate_the_h200_measured(cycles, mismatched, launches):
    """The model predicted the stale-read rate (0.55 per launch at the preset) against ~5% of
    launches mismatched on the H200; fitted, its prediction lies inside each measurement's
    95% interval (rounds 2 and 3, docs/results/megakernel-layers-h200.md)."""
    from hazards.engine.stats import rate_ci

    pr = F.predict({"variant": "stale_release", "jitter_cycles": cycles})
    low, high = rate_ci(mismatched, launches)
    assert low <= pr.probability <= high, (pr.probability, low, high)
    assert "stale read in p=0.547" in pr.reason  # the stale-read rate is still said


def test_the_strategy_reaches_the_snapshot_epoch_hang_the_h200_showed():
    """A single 101-us skew (below the layer head) kept explore from ever drawing a
    snapshot_epoch point the model rates > 0; the H200 hung at 505 us."""
    from hypothesis import find, settings

    point = find(FAM.strategy(), lambda p: p["hazard"] == "snapshot_epoch" and F.predict(p).probability > 0,
                 settings=settings(max_examples=2000, database=None))
    assert point["jitter_cycles"] / (F.CLOCK_GHZ * 1e3) > F.LAYER_HEAD_US


@pytest.mark.parametrize("variant", ["routing_no_fence", "partial_no_fence"])
def test_missing_fences_are_amd_hazards_the_model_expects_to_stay_quiet_on_the_h200(variant):
    pr = F.predict({"variant": variant})
    assert pr.probability == 0 and "AMD" in pr.platform_note
    assert F.static_model({"variant": variant}).hazardous


@given(point=FAM.strategy())
@settings(max_examples=80, deadline=None)
def test_strategy_points_stay_in_the_declared_domain_and_get_a_prediction(point):
    p = F.resolve(point)
    assert set(p) == set(FAM.defaults)
    assert p["hazard"] in M.HAZARDS and 1 <= p["layers"] <= 16 and p["model"] in M.SHAPES
    pr = F.predict(point)
    assert pr.outcome in ("clean", "hang", "mismatch", "rejected") and 0.0 <= pr.probability <= 1.0
    if p["hazard"] == "none":
        assert pr.outcome in ("clean", "rejected")


# ---- the tripwire explainer ----------------------------------------------------------------

def test_participant_set_hang_names_the_chunk_ranks_that_never_arrived():
    sl = [slot(w, layer=0, phase=PHASE_OPROJ, barrier=4, observed=0, expected=1, aux=(80, 129, NO_FEEDER))
          for w in range(132)]
    text = F.explain_hang(snapshot(132, sl), {"variant": "participant_set"})
    assert "ATTN_RELEASE in layer 0" in text and "CHUNK_MERGE counted 80 of its 129" in text
    assert "chunk ranks 80–128 never arrived" in text and "nested inside the QKV rank guard" in text


def test_chunk_supply_hang_names_the_chunks_without_a_worker():
    sl = [slot(w, layer=0, phase=PHASE_OPROJ, barrier=4, observed=0, expected=1, aux=(64, 80, NO_FEEDER))
          for w in range(64)]
    text = F.explain_hang(snapshot(64, sl), {"variant": "chunk_supply"})
    assert "chunk ranks 64–79 never arrived" in text and "have no worker (grid 64)" in text


def test_snapshot_epoch_hang_names_the_late_worker_and_its_overshot_epoch():
    sl = [slot(w, layer=1, phase=PHASE_ROUTING_WAIT, barrier=6, observed=5, expected=6,
               aux=(132 * 6 - 1, 132 * 6, NO_FEEDER)) for w in range(132) if w != 97]
    sl.append(slot(97, layer=1, phase=PHASE_OPROJ, barrier=4, observed=6, expected=7, aux=(33 * 6, 33 * 6, NO_FEEDER)))
    text = F.explain_hang(snapshot(132, sl), {"variant": "snapshot_epoch"})
    assert "131 of 132 workers wait at ROUTING in layer 1" in text
    assert "OPROJ counted 131 of 132 arrivals: worker 97 never arrived" in text and "snapshotted" in text


def test_shared_line_hang_says_the_release_fired_and_was_reverted():
    sl = [slot(w, layer=2, phase=PHASE_MOE_W2, barrier=7, observed=2, expected=3, aux=(99, 33, 17))
          for w in range(132)]
    text = F.explain_hang(snapshot(132, sl), {"variant": "shared_line"})
    assert "expert 17: all 33 W13 tiles arrived" in text and "reverted" in text


def test_a_hang_is_read_at_its_earliest_wait_not_at_the_largest_group_after_it():
    """A shared_line hang as a GPU run left it (the step-17 test, 2026-12-07): the reverted release stops the
    52 workers that read its flag copy in layer 0's W2, and the other 80 go on to wait for that layer's end
    (LAYER_END, listed first) or the next layer's merge. The groups tie at 52: the reading must start at the
    earliest wait in the kernel's order (layer 0's W13_W2), which every later wait depends on."""
    sl = [slot(w, layer=1, phase=PHASE_ATTN_CHUNK, barrier=1, observed=80, expected=132) for w in range(52)]
    sl += [slot(w, layer=0, phase=PHASE_MOE_W2, barrier=7, observed=0, expected=1, aux=(33, 33, 17))
           for w in range(52, 104)]
    sl += [slot(w, layer=1, phase=PHASE_OPROJ, barrier=4, observed=1, expected=2) for w in range(104, 132)]
    text = F.explain_hang(snapshot(132, sl), {"variant": "shared_line"})
    assert "52 of 132 workers wait at W13_W2 in layer 0 (epoch 1)" in text, text
    assert "expert 17: all 33 W13 tiles arrived" in text and "reverted" in text, text


def test_evidence_that_does_not_fit_the_switch_is_not_blamed_on_it():
    sl = [slot(w, layer=0, phase=PHASE_MOE_W2, barrier=7, observed=0, expected=1, aux=(33, 33, 17))
          for w in range(132)]
    assert "not the signature of hazard switch 'none'" in F.explain_hang(snapshot(132, sl), {"variant": "clean"})
    assert F.explain_hang(snapshot(132, [slot(0, layer=0, phase=5, waiting=False)]), {}) is None


# ---- static checks on the sync layer (clang-19 gfx942, clang-22 gfx950) ----------------------

@pytest.fixture(scope="module", params=["gfx942", "gfx950"])
def arch(request):
    from hazards.engine import toolchain
    from hazards.engine.errors import ToolchainMissing

    try:
        toolchain.find_tool("clang", "the AMDGCN checks", arch=request.param)
    except ToolchainMissing as e:
        pytest.skip(str(e))
    return request.param


@pytest.mark.parametrize("variant", [v.name for v in FAM.variants])
def test_sync_layer_static_checks_flag_exactly_the_sync_switches(arch, variant):
    found = F.static_check({"variant": variant}, arch=arch)
    failing = {f.check for f in found if f.fails}
    assert failing == F.predicted_checks({"variant": variant}, arch=arch), [f.message for f in found if f.fails]
    assert any(f.check == "sync-scope" for f in found)  # the checks really looked at polls and flags


def test_partial_no_fence_reads_productions_merge_workers_not_a_last_arriver():
    """Since round 8 production's partials are read by merge workers behind an acquire poll of the
    chunk count (step d); the model's reason says so, and the call stays AMD-hazardous, ~0 on the H200."""
    pr = F.predict({"variant": "partial_no_fence"})
    assert pr.probability == 0.0 and "merge workers" in pr.reason and "acquire.gpu poll of the chunk count" in pr.reason
    assert F.static_model({"variant": "partial_no_fence"}).hazardous


def _kernel_findings(arch: str, kernel: str, text: str | None = None) -> list:
    """The AMDGCN checks' findings inside one kernel of the sync layer's static model (`text`:
    the model's source with a change), compiled for `arch`."""
    import re

    from hazards.static import amdgcn
    from hazards.static.compile import compile_amdgcn

    annotated, stmts = amdgcn.annotate_source(F.SYNC_STATIC.read_text() if text is None else text)
    build = compile_amdgcn(F.SYNC_STATIC, arch=arch, text=annotated, label=f"test-mkl-sync-{kernel}-{arch}")
    lines = build.text.splitlines()
    starts = [i for i, line in enumerate(lines, 1) if re.match(rf"^_Z\d+{kernel}\w*:", line)]
    assert len(starts) == 1, f"{kernel} is not in the {arch} listing"
    end = next(i for i, line in enumerate(lines, 1) if i > starts[0] and line.startswith(".Lfunc_end"))
    found = amdgcn.check_listing(build.text, str(build.path), target=arch, stmts=stmts, source_path=str(F.SYNC_STATIC))
    return [f for f in found if starts[0] <= f.line <= end]


def test_the_static_model_reads_the_merge_workers_hand_off(arch):
    """Production since round 8 (step d): merge workers poll the chunk count, arrive at MERGE,
    and the last one acquires and releases ATTN_RELEASE. The static model had no such kernel,
    so gfx942's and gfx950's checks never read that hand-off."""
    found = _kernel_findings(arch, "mkl_static_merge")
    assert not [f for f in found if f.fails], [f.message for f in found if f.fails]
    scoped = [f.message for f in found if f.check == "sync-scope"]
    assert any(m.startswith("poll ") and "acquire" in m for m in scoped), scoped         # the chunk count
    assert any(m.startswith("flag `global_atomic_add`") for m in scoped), scoped         # the MERGE arrival
    assert any(m.startswith("flag `global_store_dword`") for m in scoped), scoped        # ATTN_RELEASE


def test_a_merge_worker_arriving_without_its_release_is_flagged(arch):
    """The checks see the merge hand-off itself: drop the merge blocks' release before their
    MERGE arrival and the release-order check fails inside the merge kernel."""
    text = F.SYNC_STATIC.read_text()
    arrival = "mkl::single_off(mkl::W_MERGE_CTR)), true, tid"
    assert text.count(arrival) == 1
    found = _kernel_findings(arch, "mkl_static_merge", text.replace(arrival, arrival.replace("true", "false")))
    assert "release-order" in {f.check for f in found if f.fails}, [f.message for f in found]


MKL_KERNEL = F.SYNC_STATIC.parent / "mkl_kernel.cuh"


def step_r_block() -> str:
    """mkl_kernel.cuh's `#if MKL_W13_ACQ_REL` block that defines step (r)'s fences."""
    text = MKL_KERNEL.read_text()
    start = text.index("#if MKL_W13_ACQ_REL\n")
    assert "w13_fence_acq_rel" in text[start:text.index("#endif", start)]
    depth, pos = 0, start
    for m in re.finditer(r"^#\s*(if|ifdef|ifndef|endif)\b", text[start:], re.M):
        depth += 1 if m.group(1) != "endif" else -1
        if depth == 0:
            pos = start + m.end()
            break
    return text[start:pos]


def test_step_r_fences_compile_for_amd_and_release_in_order(arch):
    """Step (r)'s W13 fences (MKL_W13_ACQ_REL, step 20) on AMD: the PTX fence is NVIDIA-only, so a HIP
    build takes the family's acquire and release fences (mkl_sync.cuh's HIP paths). The step's block of
    mkl_kernel.cuh, with the sync layer, compiles for the arch, and the checks read its arrival and
    fan-out in release order at agent scope."""
    from hazards.static import amdgcn
    from hazards.static.compile import compile_amdgcn

    text = ('#include "mkl_sync.cuh"\n#define MKL_W13_ACQ_REL 1\nnamespace mkl {\n' + step_r_block() + "\n}\n"
            "__global__ void mkl_static_w13_acq_rel(uint32_t* sync, uint32_t* out) {\n"
            "  __shared__ uint32_t word;\n"
            "  const unsigned tid = hz_static_tid();\n"
            "  out[hz_static_bid() * 256 + tid] = tid;  // the block's data\n"
            "  uint32_t* ctr = mkl::word_at(sync, mkl::single_off(mkl::W_MERGE_CTR));\n"
            "  const uint32_t old = mkl::w13_block_arrive_acq_rel(ctr, tid, &word);\n"
            "  if (old + 1u == 4u && tid == 0) mkl::w13_release_fanout_acq_rel(sync, 0, 128, 1u);\n"
            "}\n")
    annotated, stmts = amdgcn.annotate_source(text)
    build = compile_amdgcn(F.SYNC_STATIC, arch=arch, text=annotated, label=f"test-mkl-w13-acq-rel-{arch}")
    found = amdgcn.check_listing(build.text, str(build.path), target=arch, stmts=stmts,
                                 source_path=str(F.SYNC_STATIC))
    assert not [f for f in found if f.fails], [f.message for f in found if f.fails]
    assert "fence.acq_rel" not in build.text
    scoped = [f.message for f in found if f.check == "sync-scope"]  # the checks read the arrival and the fan-out
    assert any(m.startswith("flag `global_atomic_add`") for m in scoped), scoped
    assert any(m.startswith("flag `global_store_dword`") for m in scoped), scoped


def test_a_skew_shorter_than_a_layers_head_cannot_hang_the_snapshot_class():
    # round 8's production (step d): the head measured 55.6-59.6 us on an H200; a 25-us skew is below it
    # (and below step 10's, step (e)'s head: 63.9-72.1 us on H100s)
    assert F.predict({"variant": "snapshot_epoch", "jitter_cycles": 50000}).probability == 0
    assert F.predict({"variant": "snapshot_epoch"}).probability > 0.2  # the preset: 1e6 cycles, 505 us


# Step (d)'s layer head as measured (per-task profiler, previous layer's last W2 -> merge released):
# round 7 (H200, the shortened merge) and round 6 (H100, the first merge spread), microseconds.
STEP_D_HEADS_US = (55.6, 58.6, 59.6, 63.1, 67.5)
# Step (e)'s, production's head since step 10 (step (g) changes W2, after the head; never measured on
# an H200): H100s, rounds 9 (stepe-quick), 10 (stepf-quick) and 13 (steph-quick).
STEP_E_HEADS_US = (67.9, 67.2, 67.0, 69.5, 72.1, 69.6, 63.9, 64.7, 66.2)


def test_the_snapshot_model_assumes_step_d_h200_layer_head():
    """Round 8 made step (d) production: its head is 55.6-59.6 us on the H200, not step 2's
    ~96 us. A 70-us skew is above every head step (d) showed, so the model must call it a hang;
    with step 2's head it said clean. Step 10 (production from promote10 until step 14) has step (e)'s head, not
    yet measured on an H200 (on H100s 0-5 us longer than step (d)'s in the same run): the model keeps
    step (d)'s H200 head until an H200 profile of step 10 gives one (round 14 measured step 10's
    head on an H100 only: 65.4-69.4 us, where the 70-us skew hung 0 of 16 against the model's 0.23)."""
    assert 55.6 <= F.LAYER_HEAD_US <= 59.6
    assert F.predict({"variant": "snapshot_epoch", "jitter_cycles": int(70 * F.CLOCK_GHZ * 1e3)}).outcome == "hang"


def test_every_skew_the_strategy_draws_is_far_from_every_head_step_d_and_step_e_showed():
    """A drawn skew within a few us of the head could land on either side of it from launch to
    launch or card to card (the 51-us point sat 4.6 us under the H200's shortest head): each is
    at least 20 us below the shortest or above the longest measured head of production's code
    (step (d)'s merge, and since step 10 step (e)'s head), and the model's call agrees with that side."""
    heads = STEP_D_HEADS_US + STEP_E_HEADS_US
    for cycles in F.SKEW_CYCLES:
        us = cycles / (F.CLOCK_GHZ * 1e3)
        assert us <= min(heads) - 20 or us >= max(heads) + 20, us
        above = us > max(heads)
        assert (F.predict({"variant": "snapshot_epoch", "jitter_cycles": cycles}).probability > 0) is above, us


def test_the_101us_skew_hangs_the_snapshot_class_at_the_rate_measured_once_the_head_got_shorter():
    """Round 3's head (128 us) put a 101-us skew below it: 0 of 16 launches hung. Round 4's
    faster merge made the head 93.5-96 us and the same skew hung 2 of 16 launches (12%, 95% CI
    1.6-38%): the model, re-derived with the new head, predicts a rate inside that interval."""
    from hazards.engine.stats import rate_ci

    low, high = rate_ci(2, 16)
    assert low <= F.predict({"variant": "snapshot_epoch", "jitter_cycles": 200000}).probability <= high


@pytest.mark.parametrize("barrier, name, layer, expected", [
    (2, "QKV_EPOCH", 1, 80 * 2),      # a chunk worker waits for QT x epoch QKV arrivals (epoch 2: layer 1)
    (1, "LAYER_END", 2, 132 * 2),     # a QKV tile holder waits for n_rows x (epoch - 1) W2 arrivals (epoch 3)
])
def test_a_hang_at_a_counting_barrier_names_the_layer_of_its_count_not_the_raw_count(barrier, name, layer, expected):
    """QKV_EPOCH and LAYER_END wait for arrival counts, not epochs (mkl_kernel.cuh): a hang there
    (a mutant, a user's change) must name the layer the count belongs to."""
    sl = [slot(w, layer=layer, phase=PHASE_ATTN_CHUNK, barrier=barrier, observed=expected - 1, expected=expected)
          for w in range(100)]
    text = F.explain_hang(snapshot(132, sl), {"variant": "clean"})
    assert f"100 of 132 workers wait at {name} in layer {layer} (epoch {layer + 1})" in text, text
