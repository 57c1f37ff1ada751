"""Campaign step (j) (MKL_CAMPAIGN_STEP 12, candidate step_j, round 16): step 10 (production then; since
round 17 candidate step_10, step (j)'s base) with 40-row
QKV tiles instead of 64 (mkl_model.h's QKV_TILE_ROWS; switch MKL_QKV_SPREAD in mkl_kernel.cuh).

At the default shape 5,120 QKV rows make 128 tiles of 40 on workers 0-127 instead of 80 of 64 (round 15's
profile, H100: the QKV tile 28 us for 369 KB on each of 80 SMs while 52 SMs hold none). On the CPU (nvcc
13.0, sm_90a): ring_probe.cu's qkv_tile_probe stores the build's tile rows, tiles and the tile's column
parts (PTX constants): production (step 22, step 10's tiles) 64 rows, 80 / 24 tiles (default / small), 2 parts; step (j) 40 rows,
128 / 39 tiles, 4 parts of 90 chunks (3 rounds of gemv_round<4> on the busiest warp, not 4). The Python
schedule model states the same per build (model.qkv_tile_rows(defines)): participant_set still hangs on
step (j)'s build (129 chunks > 128 tiles: chunk rank 128 is never served) and the explainer names that
rank; snapshot_epoch's vulnerable workers drop from 52 to 4. No function of the step (j) build spills
more than step 10's (ptxas -v), the compiled static checks pass it with step 10's polls, and every
campaign switch but MKL_QKV_SPREAD is step 10's. Before this change MKL_CAMPAIGN_STEP 12 built step
(e)'s kernel with 64-row tiles (no flag read 12): the tiling, model and switch tests fail there.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from hazards.families import megakernel_layers as F
from hazards.megakernel_layers import faithful as FA
from hazards.megakernel_layers import model as M
from hazards.megakernel_layers.explain import BAR_ATTN_RELEASE, BAR_CHUNK_MERGE

from .sass_text import spills_grown
from .test_gemv_one_round import _spills, _warp_rounds, probe_stores
from .test_merge_spread import assert_static_checks_pass_with_the_polls_of
from .test_production_step22 import switches_changed_from_step_10
from .tripwire_fakes import NO_FEEDER, PHASE_ATTN_MERGE, PHASE_OPROJ, slot, snapshot

STEP_J = {"MKL_CAMPAIGN_STEP": 12}
SMS = 132  # the H100's and the H200's: grid 0
GEMV_ROWS = 4


def _probe(step: int) -> dict[str, int]:
    keys = ("rows", "tiles_default", "tiles_small", "kparts_default", "kparts_small", "kparts_small_last")
    values = probe_stores(step, "_Z14qkv_tile_probePi")
    assert len(values) == len(keys), values
    return dict(zip(keys, values))


def test_the_probe_spells_out_the_model_shapes():
    src = (Path(__file__).resolve().parent / "ring_probe.cu").read_text()
    for name in ("default", "small"):
        s = M.SHAPES[name]
        assert "{" + f"{s.D}, {s.NQ}, {s.NKV}, {s.E}, {s.K}, {s.I}" + "}" in src, name


@pytest.mark.parametrize("step, defines", [(10, None), (12, STEP_J)])
def test_the_build_tiles_qkv_as_the_python_model_says(step, defines):
    """The probe's constants (the C header in that build) are the Python model's for that build."""
    got = _probe(step)
    rows = M.qkv_tile_rows(defines)
    assert got["rows"] == rows and rows == (40 if step == 12 else 64)
    assert got["tiles_default"] == M.qkv_tiles(M.SHAPES["default"], rows)
    assert got["tiles_small"] == M.qkv_tiles(M.SHAPES["small"], rows)


def test_production_tiles_qkv_in_64_rows_on_80_workers_in_2_parts():
    assert _probe(14) == {"rows": 64, "tiles_default": 80, "tiles_small": 24, "kparts_default": 2,
                          "kparts_small": 2, "kparts_small_last": 2}
    assert M.qkv_tile_rows(None) == M.qkv_tile_rows({"MKL_CAMPAIGN_STEP": 11}) == M.QKV_TILE_ROWS == 64


def test_step_j_tiles_qkv_in_40_rows_on_128_workers_in_4_parts_of_one_round():
    got = _probe(12)
    assert got == {"rows": 40, "tiles_default": 128, "tiles_small": 39, "kparts_default": 4, "kparts_small": 4,
                   "kparts_small_last": 4}
    s = M.SHAPES["default"]
    nchunk = s.D // 8
    # the busiest warp: 3 rounds (40 items of 90 chunks on 16 warps), step 10's (production's) 4 (32 items of 180)
    assert _warp_rounds((40 // GEMV_ROWS, 1, nchunk), got["kparts_default"]) == 3
    assert _warp_rounds((64 // GEMV_ROWS, 1, nchunk), _probe(10)["kparts_default"]) == 4
    assert 40 * s.D * 2 == 230_400 and 64 * s.D * 2 == 368_640  # weight bytes a worker streams a layer


def test_40_rows_are_the_fewest_whole_row_groups_whose_tiles_fit_the_workers():
    """The most workers a tile each: a tile of whole row groups (GEMV_ROWS) and at most 132 tiles."""
    rows = M.qkv_rows(M.SHAPES["default"])
    fits = [r for r in range(GEMV_ROWS, 65, GEMV_ROWS) if -(-rows // r) <= SMS]
    assert fits[0] == M.qkv_tile_rows(STEP_J) == 40 and rows % 40 == 0
    small = M.qkv_rows(M.SHAPES["small"])
    assert M.qkv_tiles(M.SHAPES["small"], 40) <= SMS and (small - 38 * 40) % GEMV_ROWS == 0  # last tile: 16 rows


@pytest.mark.parametrize("model", ["default", "small"])
@pytest.mark.parametrize("workers", [132, 64])
def test_step_j_schedule_covers_every_qkv_row_once(model, workers):
    s = M.SHAPES[model]
    sc = M.schedule(s, seq=4096, workers=workers, tile_rows=M.qkv_tile_rows(STEP_J),
                    merge_heads=M.merge_heads_per_worker(STEP_J))
    rows = [r for t in range(sc.qkv_tiles) for r in range(t * 40, min((t + 1) * 40, M.qkv_rows(s)))]
    assert rows == list(range(M.qkv_rows(s)))
    # step (d)'s merge workers, unchanged: step 21's (16 heads a worker), not production's (step 22: one a worker)
    step_21 = M.schedule(s, seq=4096, workers=workers, merge_heads=M.merge_heads_per_worker({"MKL_CAMPAIGN_STEP": 21}))
    assert sc.merge_workers() == step_21.merge_workers() < M.schedule(s, seq=4096, workers=workers).merge_workers()


def test_participant_set_still_hangs_on_step_j_build_with_chunk_rank_128_unserved():
    """The variant's seq 16384 gives 129 chunks (128 tokens a chunk, capped at 132 workers): one more
    than step (j)'s 128 tiles, so worker 128 never reaches its chunk (production: ranks 80-128)."""
    p = F.resolve({"variant": "participant_set"})
    sc = M.describe(p, SMS, STEP_J)
    assert (sc.chunks, sc.qkv_tiles) == (129, 128)
    assert [c for c in range(sc.chunks) if not sc.serves_chunk(c)] == [128]
    pr = F.predict({"variant": "participant_set"}, defines=STEP_J)
    assert (pr.outcome, pr.probability) == ("hang", 1.0) and "only 128 of 129" in pr.reason
    # below the tiles it does not bite: round 15's "seq 12000 (94 chunks > 80 tiles)" point is clean here
    assert F.predict({"variant": "participant_set", "seq": 12000}, defines=STEP_J).outcome == "clean"
    assert F.predict({"variant": "participant_set", "seq": 12000}).outcome == "hang"


def assert_step_j_participant_set_hang_explained(text: str) -> None:
    """A participant_set hang of step (j)'s build as its explanation must read (this CPU test's fake
    snapshot, and test_gpu.py's hang on the device): the device counted 128 of the 129 chunk arrivals
    (the CHUNK_MERGE watch's counter, which the watch carries), the count step (j)'s schedule predicts,
    and chunk rank 128 is the one that never arrived."""
    assert "CHUNK_MERGE counted 128 of its 129 arrivals" in text, text
    assert "chunk ranks 128 never arrived" in text and "the schedule predicts" not in text, text
    assert "only min(QKV tiles 128, workers " in text, text


def test_step_j_participant_set_hang_names_chunk_rank_128():
    sl = [slot(w, layer=0, phase=PHASE_ATTN_MERGE, barrier=BAR_CHUNK_MERGE, observed=128, expected=129,
               aux=(128, 129, NO_FEEDER)) for w in range(4)]
    sl += [slot(w, layer=0, phase=PHASE_OPROJ, barrier=BAR_ATTN_RELEASE, observed=0, expected=1,
                aux=(128, 129, NO_FEEDER)) for w in range(4, SMS)]
    text = F.explain_hang(snapshot(SMS, sl), {"variant": "participant_set"}, STEP_J)
    assert_step_j_participant_set_hang_explained(text)
    assert "min(QKV tiles 128, workers 132)" in text, text
    # read as production's schedule, the same snapshot contradicts it
    assert "(the schedule predicts 80)" in F.explain_hang(snapshot(SMS, sl), {"variant": "participant_set"})


def test_repro_with_step_j_defines_builds_step_j_and_explains_its_hang_with_step_j_tiles(monkeypatch):
    """`hazards repro --family megakernel_layers -D MKL_CAMPAIGN_STEP=12` builds step (j)'s binary and its
    hang reads step (j)'s schedule (128 tiles), not production's (80: "the schedule predicts 80")."""
    import hazards.stress_family as SF
    from hazards.cli import repro

    built = []
    monkeypatch.setattr(SF, "family_binary", lambda fam, defines=None: built.append(defines) or Path("/bin/true"))
    defines = repro._defines(["MKL_CAMPAIGN_STEP=12"])
    assert defines == STEP_J
    repro._family_spec("megakernel_layers", "participant_set", {}, None, None, defines)
    assert built == [STEP_J]
    sl = [slot(w, layer=0, phase=PHASE_ATTN_MERGE, barrier=BAR_CHUNK_MERGE, observed=128, expected=129,
               aux=(128, 129, NO_FEEDER)) for w in range(4)]
    sl += [slot(w, layer=0, phase=PHASE_OPROJ, barrier=BAR_ATTN_RELEASE, observed=0, expected=1,
                aux=(128, 129, NO_FEEDER)) for w in range(4, SMS)]
    text = repro._family_explainer("megakernel_layers", defines)(snapshot(SMS, sl), {"variant": "participant_set"})
    assert text == F.explain_hang(snapshot(SMS, sl), {"variant": "participant_set"}, STEP_J), text
    assert "min(QKV tiles 128, workers 132)" in text and "the schedule predicts" not in text, text
    # without -D it is production's build, explained with production's tiles
    prod = repro._family_explainer("megakernel_layers")(snapshot(SMS, sl), {"variant": "participant_set"})
    assert "(the schedule predicts 80)" in prod, prod


def test_snapshot_epoch_has_4_vulnerable_workers_on_step_j_build_not_52():
    prod, step_j = F.predict({"variant": "snapshot_epoch"}), F.predict({"variant": "snapshot_epoch"}, defines=STEP_J)
    assert prod.reason.startswith("52 workers") and step_j.reason.startswith("4 workers")
    assert step_j.outcome == "hang" and 0 < step_j.probability < prod.probability / 5


def test_step_j_spills_no_more_than_step_10_anywhere():
    _, prod = _spills({"MKL_CAMPAIGN_STEP": 10}, "test-mkl-step-j-spills-step10")
    _, step = _spills(STEP_J, "test-mkl-step-j-spills")
    assert set(step) == set(prod) and any("mkl_megakernel" in k for k in prod), sorted(step)
    worse = spills_grown(prod, step)
    assert not worse, worse


def test_step_j_passes_the_compiled_static_checks_with_step_10_polls():
    assert_static_checks_pass_with_the_polls_of(12, 10)


def test_step_j_is_step_10_but_for_the_qkv_tiles_and_a_candidate_of_the_gate():
    c = FA.candidate("step_j")
    assert dict(c.defines) == STEP_J and c.params == ()
    assert c.expected == "sloughing"  # the same QKV work on 128 blocks, not 80 (round 16, against step 10)
    changed, prod, step = switches_changed_from_step_10(STEP_J)
    assert changed == {"MKL_CAMPAIGN_STEP", "MKL_QKV_SPREAD"}
    assert step["MKL_QKV_SPREAD"] == 1 and step["MKL_W2_QUANT_AHEAD"] == 1 and prod["MKL_QKV_SPREAD"] == 0
