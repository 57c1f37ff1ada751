"""The tolerance-calibration table separates correct from mishandled (CPU, tiny shapes)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hazards.ragged_decode.calibration import calibrate, tiled_decode_fp32  # noqa: E402
from hazards.ragged_decode.reference import make_arena, reference_decode  # noqa: E402

LENS = [48, 48, 24, 24, 24, 12, 12, 12, 12, 6, 6]


@pytest.fixture(scope="module")
def table():
    k, v = make_arena(LENS, 2, 16, seed=11)
    cands = {"reference itself": lambda q, s, l: reference_decode(q, k, v, s, l),
             "tiled, no rescale": lambda q, s, l: tiled_decode_fp32(q, k, v, s, l, tile=8, rescale=False)}
    return calibrate(k, v, LENS, 8, seeds=(0, 1), calls=2, clamp=16, tile=8, candidates=cands)


def test_independent_error_is_far_below_tol(table):
    assert table.draws == 4
    assert 0 < table.floor < table.tol / 3


def test_every_mishandling_is_caught(table):
    bad = [r for r in table.rows if r.kind == "mishandling"]
    assert len(bad) == 4
    assert all(len(r.errors) == 4 and r.worst > table.tol for r in bad)
    assert table.sound()


def test_candidates_get_verdicts(table):
    verdicts = {name: ratio for name, _, ratio in table.lines()}
    assert verdicts["reference itself"] == "pass"
    assert verdicts["tiled, no rescale"] == "FAIL"
    assert any(r.startswith("tol/E") for r in verdicts.values())


def test_mishandlings_report_their_least_detectable_draw(table):
    row = next(r for r in table.rows if r.kind == "mishandling")
    assert row.worst == min(row.errors)
