"""The megakernel on a real GPU (Hopper, sm_90a): correctness, counter reset, graph capture."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hazards.ragged_decode.calibration import tiled_decode_fp32  # noqa: E402
from hazards.ragged_decode.reference import CONTRACT_CFG, draw_call, make_arena, reference_decode, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu
TOL = 1e-2


def needs_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the megakernel is built for sm_90a (H100/H200)")


def run(handle, q, starts, lens):
    from hazards.ragged_decode.kernel import ragged_decode

    out = torch.full((q.shape[0], q.shape[1] * q.shape[2]), float("nan"), device="cuda")  # poison
    ragged_decode(handle, q, starts, lens, out=out)
    torch.cuda.synchronize()
    return out


@pytest.fixture(scope="module")
def contract_arena():
    needs_hopper()
    k, v = make_arena(CONTRACT_CFG["lens"], CONTRACT_CFG["n_kv"], CONTRACT_CFG["hd"], device="cuda", seed=0)
    yield k, v
    del k, v
    torch.cuda.empty_cache()


@pytest.mark.parametrize("schedule,copies", [("guided", "contiguous"), ("guided", "rows"), ("split", "contiguous"),
                                             ("per_request", "contiguous")])
def test_contract_fixture_matches_reference_with_fresh_permutations(contract_arena, schedule, copies):
    from hazards.ragged_decode.kernel import build_sched, error_flags

    k, v = contract_arena
    h = build_sched({}, {"k": k, "v": v}, CONTRACT_CFG, 1, schedule=schedule, copies=copies)
    gen = torch.Generator().manual_seed(7)
    for _ in range(2):
        q, starts, lens = draw_call(CONTRACT_CFG["lens"], CONTRACT_CFG["n_q"], CONTRACT_CFG["hd"], gen, device="cuda")
        out = run(h, q, starts, lens)
        assert torch.isfinite(out).all(), "unwritten or non-finite output"
        assert rel_err(out, reference_decode(q, k, v, starts, lens)) < TOL
    assert error_flags(h) == []


@pytest.mark.parametrize("n_q,n_kv,schedule,copies", [(8, 2, "guided", "contiguous"), (8, 8, "guided", "rows"),
                                                      (16, 2, "split", "contiguous"), (32, 8, "guided", "contiguous"),
                                                      (32, 8, "guided", "rows"), (4, 4, "per_request", "contiguous")])
def test_odd_lengths_tails_and_group_sizes(n_q, n_kv, schedule, copies):
    needs_hopper()
    from hazards.ragged_decode.kernel import build_sched

    lens = [1, 0, 15, 16, 17, 31, 33, 250, 1000, 2049, 7, 0, 129, 64, 5, 4097]
    cfg = dict(n_q=n_q, n_kv=n_kv, hd=128, lens=lens)
    k, v = make_arena(lens, n_kv, 128, device="cuda", seed=1)
    h = build_sched({}, {"k": k, "v": v}, cfg, 1, schedule=schedule, split_tokens=100, phases=3, copies=copies)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        q, starts, lens_t = draw_call(lens, n_q, 128, gen, device="cuda")
        out = run(h, q, starts, lens_t)
        ref = tiled_decode_fp32(q, k, v, starts, lens_t, tile=64)
        assert torch.isfinite(out).all()
        assert rel_err(out, ref) < 5e-3  # vs fp32: bf16 P is the only loss; bad indexing is O(1)
        empty = (lens_t == 0).nonzero().flatten().tolist()
        assert empty and all(torch.count_nonzero(out[b]) == 0 for b in empty)


def test_repeated_calls_are_bitwise_identical(contract_arena):
    """Counters reset inside the kernel and partials merge in slot order: no drift, no race."""
    from hazards.ragged_decode.kernel import build_sched

    k, v = contract_arena
    h = build_sched({}, {"k": k, "v": v}, CONTRACT_CFG, 1)
    q, starts, lens = draw_call(CONTRACT_CFG["lens"], 32, 128, torch.Generator().manual_seed(1), device="cuda")
    first = run(h, q, starts, lens)
    for _ in range(5):
        assert torch.equal(run(h, q, starts, lens), first)


def test_bad_request_is_nan_and_flagged_not_a_fault():
    needs_hopper()
    from hazards.ragged_decode.kernel import build_sched, error_flags

    lens = [100, 50, 20]
    cfg = dict(n_q=8, n_kv=2, hd=128, lens=lens)
    k, v = make_arena(lens, 2, 128, device="cuda", seed=2)
    h = build_sched({}, {"k": k, "v": v}, cfg, 1)
    q, starts, lens_t = draw_call(lens, 8, 128, torch.Generator().manual_seed(0), device="cuda")
    starts[1] = 10_000  # outside the 170-row arena
    out = run(h, q, starts, lens_t)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()
    assert error_flags(h)


def test_graph_capture_holds_one_kernel_and_replays_correctly(contract_arena):
    from hazards.ragged_decode.kernel import build_sched, graph_node_counts, ragged_decode

    k, v = contract_arena
    h = build_sched({}, {"k": k, "v": v}, CONTRACT_CFG, 1)
    q, starts, lens = draw_call(CONTRACT_CFG["lens"], 32, 128, torch.Generator().manual_seed(2), device="cuda")
    out = torch.empty(128, 4096, device="cuda")
    ragged_decode(h, q, starts, lens, out=out)  # warm up outside the capture
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        g = None  # this torch cannot hand out the raw graph: replay is still checked
    g = g or torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ragged_decode(h, q, starts, lens, out=out)
    if hasattr(g, "raw_cuda_graph"):
        assert graph_node_counts(h, g)[0] == 1
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(out, reference_decode(q, k, v, starts, lens)) < TOL
