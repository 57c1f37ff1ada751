"""The torch reference of the layered megakernel's model, on tiny shapes on the CPU."""
from __future__ import annotations

import pytest
import torch

from hazards.megakernel_layers import model as M
from hazards.megakernel_layers import reference as R

TINY = M.Shape(D=64, NQ=4, NKV=2, E=4, K=2, I=96)        # 3 sub-blocks: a short last FP8 block
TINY_ALIGNED = M.Shape(D=64, NQ=4, NKV=2, E=4, K=2, I=128)


@pytest.fixture(scope="module")
def tiny() -> R.Weights:
    return R.make_weights(TINY, layers=3, seq=40, seed=7)


def test_torch_weights_are_the_hash_the_kernel_fills_with():
    w = R.make_weights(TINY, layers=2, seq=5, seed=3)
    key = M.tensor_key(3, M.T_W13, 1, 2)
    flat = w.w13[1][2].reshape(-1)
    for i in (0, 1, 77, flat.numel() - 1):
        want = torch.tensor(M.uniform_pm(key, i, M.SCALE_W), dtype=torch.float32).to(torch.bfloat16)
        assert flat[i] == want
    assert w.kcache[0].shape == (5, TINY.NKV, M.HD) and w.x0.dtype == torch.float32
    u = torch.tensor(M.uniform_pm(M.tensor_key(3, M.T_ATTN_NORM, 1, 0), 0, M.SCALE_NORM), dtype=torch.float32)
    assert w.attn_norm[1][0] == torch.tensor(1.0, dtype=torch.float32) + u  # fp32 add, as the kernel's fill


def test_fp8_roundtrip_uses_the_smallest_power_of_two_scale_per_128():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, generator=g) * 3
    q = R.fp8_roundtrip(x)
    for b in range(0, 300, 128):
        blk = x[b:b + 128]
        amax = float(blk.abs().max())
        scale = 1.0
        while amax / scale > 448:
            scale *= 2
        while amax / (scale / 2) <= 448:
            scale /= 2
        want = (blk / scale).to(torch.float8_e4m3fn).float() * scale
        assert torch.equal(q[b:b + 128], want)
    assert torch.equal(R.fp8_roundtrip(q), q)  # already on the grid
    tail = R.fp8_roundtrip(x, zero_tail_block=True)
    assert torch.equal(tail[:256], q[:256]) and not tail[256:].any()
    assert torch.equal(R.fp8_roundtrip(x[:256], zero_tail_block=True), q[:256])  # no short block: no tail


def test_bf16_pairs_read_as_fp32_are_the_dead_flags_input():
    x = torch.tensor([1.0, -2.0, 0.5, 3.0])
    y = R.bf16_pairs_as_fp32(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    assert not y[2:].any()                       # the fp32 buffer's second half was never packed
    assert float(y[0]) == pytest.approx(-2.0, rel=1e-2)  # high half: element 1


def test_chunked_attention_merges_to_the_full_softmax():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, M.HD, generator=g)
    k = (torch.randn(70, 2, M.HD, generator=g) * 2).to(torch.bfloat16)
    v = torch.randn(70, 2, M.HD, generator=g).to(torch.bfloat16)
    full, _ = R.attention(q, k, v)
    chunked, parts = R.attention(q, k, v, chunk_tokens=16)
    assert len(parts) == 5
    assert R.rel_err(chunked, full) < 1e-5


def test_independent_implementation_is_close_and_every_mishandling_is_far(tiny):
    ref = R.forward(tiny)
    assert torch.equal(R.forward(tiny), ref)      # deterministic
    floor = R.rel_err(R.forward(tiny, acc=torch.float64, chunk_tokens=16), ref)
    assert floor < 1e-5
    for name, bad in R.MISHANDLINGS.items():
        d = R.rel_err(R.forward(tiny, bad=bad), ref)
        assert d > 100 * floor and d > 1e-3, (name, d, floor)


def test_mishandlings_need_their_preconditions():
    one = R.make_weights(TINY, layers=1, seq=20, seed=2)
    ref = R.forward(one)
    for name in ("stale_release", "routing_no_fence", "stale_descriptor"):
        assert torch.equal(R.forward(one, bad=R.MISHANDLINGS[name]), ref), name  # nothing earlier to be stale
    # (the stale chunk is emulated in the chunked merge: equal up to the merge's rounding)
    assert R.rel_err(R.forward(one, bad=R.MISHANDLINGS["partial_no_fence"]), ref) < 1e-5
    aligned = R.make_weights(TINY_ALIGNED, layers=2, seq=20, seed=2)
    assert torch.equal(R.forward(aligned, bad=R.MISHANDLINGS["amax_tail"]), R.forward(aligned))


def test_the_fast_torch_step_is_the_same_model_in_bf16(tiny):
    ref = R.forward(tiny)
    eager = R.step_bf16(tiny, R.bf16_cache(tiny), host_routing=True).float()
    gathered = R.step_bf16(tiny, R.bf16_cache(tiny), host_routing=False).float()
    assert R.rel_err(eager, ref) < 5e-2 and R.rel_err(gathered, eager) < 1e-2


def test_the_minimal_byte_torch_step_reads_the_experts_the_eager_step_chose(tiny):
    """The fair baseline's capture: routing frozen at the eager step's ids, F.linear on each
    expert's weights in place, gives the eager step's bits; other frozen ids give another
    step (the ids really decide which weights are read)."""
    ids = R.host_ids(tiny, R.bf16_cache(tiny))
    assert len(ids) == tiny.layers and all(len(i) == tiny.shape.K for i in ids)
    eager = R.step_bf16(tiny, R.bf16_cache(tiny), host_routing=True)
    fixed = R.step_bf16(tiny, R.bf16_cache(tiny), fixed_ids=ids)
    assert torch.equal(fixed, eager)
    other = [[(e + 1) % tiny.shape.E for e in layer] for layer in ids]
    assert not torch.equal(R.step_bf16(tiny, R.bf16_cache(tiny), fixed_ids=other), eager)
