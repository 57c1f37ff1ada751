"""The torch reference, the fixtures and the independent fp32 implementation (CPU, tiny)."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from hazards.ragged_decode.calibration import tiled_decode_fp32  # noqa: E402
from hazards.ragged_decode.reference import (draw_call, make_arena, reference_decode,  # noqa: E402
                                          rel_err, segment_starts)

LENS = [40, 40, 20, 20, 20, 20, 9, 9, 9, 3, 1]
N_Q, N_KV, HD = 8, 2, 16


def direct_fp64(q, k, v, starts, lens):
    out = torch.zeros(q.shape[0], q.shape[1] * q.shape[2], dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for b, (s, n) in enumerate(zip(starts.tolist(), lens.tolist())):
        kb = k[s:s + n].double().repeat_interleave(group, dim=1)  # (n, n_q, hd)
        vb = v[s:s + n].double().repeat_interleave(group, dim=1)
        sc = torch.einsum("hd,nhd->hn", q[b].double(), kb) / math.sqrt(q.shape[2])
        out[b] = torch.einsum("hn,nhd->hd", sc.softmax(-1), vb).reshape(-1)
    return out


@pytest.fixture(scope="module")
def fixture():
    k, v = make_arena(LENS, N_KV, HD, seed=3)
    q, starts, lens = draw_call(LENS, N_Q, HD, torch.Generator().manual_seed(5))
    return q, k, v, starts, lens


def test_reference_matches_float64_attention(fixture):
    q, k, v, starts, lens = fixture
    assert rel_err(reference_decode(q, k, v, starts, lens), direct_fp64(q, k, v, starts, lens)) < 1e-2


def test_independent_fp32_tiles_match_float64_tightly(fixture):
    q, k, v, starts, lens = fixture
    assert rel_err(tiled_decode_fp32(q, k, v, starts, lens, tile=8), direct_fp64(q, k, v, starts, lens)) < 1e-5


def test_merge_is_independent_of_the_tile_size(fixture):
    q, k, v, starts, lens = fixture
    small = tiled_decode_fp32(q, k, v, starts, lens, tile=3)
    assert rel_err(small, tiled_decode_fp32(q, k, v, starts, lens, tile=1000)) < 1e-6


def test_merge_without_rescale_is_wrong(fixture):
    q, k, v, starts, lens = fixture
    bad = tiled_decode_fp32(q, k, v, starts, lens, tile=8, rescale=False)
    assert rel_err(bad, direct_fp64(q, k, v, starts, lens)) > 0.05


def test_draw_call_permutes_the_segments():
    gen = torch.Generator().manual_seed(0)
    draws = [draw_call(LENS, N_Q, HD, gen) for _ in range(3)]
    segs = sorted(zip(segment_starts(LENS), LENS))
    for q, starts, lens in draws:
        assert q.shape == (len(LENS), N_Q, HD) and q.dtype == torch.bfloat16
        assert starts.dtype == lens.dtype == torch.int32
        assert sorted(zip(starts.tolist(), lens.tolist())) == segs  # same multiset, same arena
    assert draws[0][1].tolist() != draws[1][1].tolist()  # a fresh assignment every call


def test_empty_request_gives_zeros_and_nan_gives_infinite_error(fixture):
    q, k, v, starts, lens = fixture
    lens = lens.clone()
    lens[0] = 0
    out = reference_decode(q, k, v, starts, lens)
    assert torch.count_nonzero(out[0]) == 0
    assert rel_err(torch.full_like(out, float("nan")), out) == float("inf")
