"""Diagnoses of synthetic snapshots: each shape of hang gets the sentence it should."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hazards.engine.errors import UserError
from hazards.engine.tripwire import Names, analyze, decode, load_names
from tw_synth import Image

ROOT = Path(__file__).resolve().parents[2]
NAMES = Names(phases={7: "MOE_W13_W2", 6: "WAIT_RELEASE", 4: "ATTN_CHUNK"},
              barriers={3: "ATTN_RELEASE", 4: "MOE_W13_W2", 2: "CHUNK_MERGE", 1: "GRID"})


def test_the_issue_example_reads_as_the_issue_says() -> None:
    img = Image(240, generation=7)
    for w in range(237):
        img.wait(w, 3, 1203, 1204, layer=12, phase=6)
    for w in range(237, 240):
        img.pos(w, 11, 7)
    d = analyze(img.snapshot(), names=NAMES)
    assert d.sentence == ("237 workers wait at barrier ATTN_RELEASE epoch 1204 (observed 1203); "
                          "3 stragglers at MOE_W13_W2 layer 11 — a producer never arrived")
    assert d.verdict == "producer_never_arrived"
    assert d.stragglers == [237, 238, 239]


def test_grid_over_residency_names_the_barrier_and_the_missing_block() -> None:
    img = Image(1057)
    for w in range(1056):
        img.wait(w, 1, 1056, 1057, phase=2)
    d = analyze(img.snapshot(), names=NAMES)
    assert d.sentence.startswith("1056 workers wait at barrier GRID epoch 1057 (observed 1056); "
                                 "1 worker never started (block never resident)")
    assert "never became resident" in d.sentence
    assert d.never_started == [1056]


def test_chunk_participants_short_of_the_count_are_named() -> None:
    img = Image(30)
    for w in range(10):
        img.wait(w, 2, 10, 16, phase=4)
    for w in range(10, 30):
        img.wait(w, 3, 0, 1, phase=6)
    d = analyze(img.snapshot(), names=NAMES)
    assert d.sentence.startswith("20 workers wait at barrier ATTN_RELEASE epoch 1 (observed 0); "
                                 "10 stragglers at ATTN_CHUNK layer 0 (waiting at CHUNK_MERGE, observed 10 of 16)")
    assert "every live worker is waiting" in d.sentence
    assert "CHUNK_MERGE counted 10 arrivals, all of them waiting there, of the 16 it expects" in d.sentence


def test_a_worker_a_layer_behind_waiting_for_the_groups_epoch_is_epoch_skew() -> None:
    img = Image(64)
    for w in range(64):
        if w == 40:
            img.wait(w, 3, 5, 6, layer=4, phase=6)  # the laggard: layer 4 expecting layer 5's epoch
        elif w == 3:
            img.wait(w, 4, 319, 320, layer=5, phase=7)  # the next merger, waiting for its MoE tiles
        else:
            img.wait(w, 3, 5, 6, layer=5, phase=6)
    d = analyze(img.snapshot(), names=NAMES)
    assert d.sentence.startswith("63 workers wait at barrier ATTN_RELEASE epoch 6 (observed 5); "
                                 "1 straggler at MOE_W13_W2 layer 5 (waiting at MOE_W13_W2, observed 319 of 320)")
    assert d.skewed == [{"worker": 40, "layer": 4, "group_layer": 5}]
    assert "snapshotted a layer late" in d.sentence


def test_observed_at_or_past_expected_while_waiting_is_stale_or_overrun() -> None:
    img = Image(4)
    for w in range(4):
        img.wait(w, 3, 7, 6)
    d = analyze(img.snapshot(), names=NAMES)
    assert d.verdict == "stale_or_overrun"
    assert "observed ≥ expected but still waiting" in d.sentence


def test_no_breadcrumb_of_this_launch_means_the_kernel_never_started() -> None:
    d = analyze(Image(16, generation=3).snapshot())
    assert d.verdict == "kernel_never_started"


def test_generation_zero_means_no_launch_went_through_the_tripwire() -> None:
    d = analyze(Image(16, generation=0).snapshot())
    assert d.verdict == "no_launch"


def test_an_empty_file_means_the_program_never_opened_the_tripwire() -> None:
    d = analyze(decode(b""))
    assert d.verdict == "no_tripwire" and "never opened" in d.sentence


def test_second_snapshot_separates_spinning_from_frozen() -> None:
    a, b = Image(4), Image(4)
    for img, spins in ((a, 1024), (b, 9216)):
        img.wait(0, 3, 1, 2, spins=spins)
        img.wait(1, 3, 1, 2, spins=spins)
        img.wait(2, 3, 1, 2, spins=1024)  # never polled again: frozen
        img.pos(3, 2, 7)  # straggler that did not move
    d = analyze(a.snapshot(100.0), b.snapshot(101.0), names=NAMES)
    g = d.groups[0]
    assert (g["spinning"], g["frozen"]) == (2, 1)
    assert d.interval_s == pytest.approx(1.0)
    assert any("did not poll in 1.00 s" in n for n in d.notes)
    assert any("did not move in 1.00 s" in n for n in d.notes)


def test_nothing_moving_at_all_is_called_out() -> None:
    img = Image(3)
    for w in range(3):
        img.wait(w, 3, 1, 2)
    d = analyze(img.snapshot(1.0), img.snapshot(2.0))
    assert any("nothing moved" in n for n in d.notes)


def test_a_new_generation_between_snapshots_is_progress_not_a_hang() -> None:
    a, b = Image(2, generation=5), Image(2, generation=9)
    d = analyze(a.snapshot(1.0), b.snapshot(2.0))
    assert d.verdict == "progressing"


def test_a_launch_queued_behind_a_hung_one_diagnoses_the_hung_one() -> None:
    img = Image(4, generation=6)
    for w in range(4):
        img.pos(w, 0, 6, gen=5)
    img.words[0][1] = 0  # untouched barrier words are fine
    d = analyze(img.snapshot())
    assert d.generation == 5
    assert any("launch 6 was queued" in n for n in d.notes)
    assert d.counts["running"] == 4


def test_warp_masks_that_disagree_are_reported_for_stragglers() -> None:
    img = Image(3)
    img.wait(0, 3, 0, 1)
    img.wait(1, 3, 0, 1)
    img.pos(2, 4, 7).warp_bytes(2, [9, 9, 9, 9], [9, 9, 9, 0])
    d = analyze(img.snapshot())
    assert {"worker": 2, "point": 9, "arrive": "0xf", "exit": "0x7"} in d.warp_masks


def test_all_workers_done_points_outside_the_kernel() -> None:
    img = Image(3)
    for w in range(3):
        img.done(w)
    assert analyze(img.snapshot()).verdict == "finished"


def test_diagnosis_serialises_to_json_and_text() -> None:
    img = Image(2)
    img.wait(0, 3, 0, 1).pos(1, 1, 7)
    d = analyze(img.snapshot(), names=NAMES)
    assert json.loads(json.dumps(d.to_json()))["verdict"] == d.verdict
    assert d.to_text().startswith(d.sentence)


def test_names_come_from_the_kernels_own_header() -> None:
    n = load_names(ROOT / "standalone" / "deadlock" / "deadlock_names.h")
    assert n.barrier(3) == "ATTN_RELEASE" and n.barrier(1) == "GRID"
    assert n.phase(7) == "MOE_W13_W2"
    assert n.barrier(99) == "#99" and n.phase(0xFFF) == "DONE"


def test_names_from_json(tmp_path: Path) -> None:
    p = tmp_path / "n.json"
    p.write_text('{"phases": {"0x10": "QKV"}, "barriers": {"7": "ATTN_RELEASE"}}')
    n = load_names(p)
    assert n.phase(16) == "QKV" and n.barrier(7) == "ATTN_RELEASE"


@pytest.mark.parametrize("content, suffix", [("{not json", ".json"), ("int x = 3;", ".h")])
def test_bad_names_file_is_a_user_error(tmp_path: Path, content: str, suffix: str) -> None:
    p = tmp_path / f"names{suffix}"
    p.write_text(content)
    with pytest.raises(UserError):
        load_names(p)
