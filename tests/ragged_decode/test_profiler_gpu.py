"""The per-task profiler inside the ragged-decode megakernel on a real GPU: every task kind
recorded by its id with the instance counts the schedule predicts, spans nested in the
block's lifetime, overflow on the real ring counted, outputs unchanged by profiling, and
the faithful check's FAITHFUL_RESULT lines judged by the engine."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hazards.ragged_decode import schedule as sched  # noqa: E402
from hazards.ragged_decode.reference import draw_call, make_arena, reference_decode, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
LENS = [4097, 3000, 2048, 100, 0, 17, 9000, 1]
CFG = dict(n_q=32, n_kv=8, hd=128, lens=LENS)


@pytest.fixture(scope="module")
def arena():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the megakernel is built for sm_90a (H100/H200)")
    return make_arena(LENS, 8, 128, device="cuda", seed=2)


def test_every_task_kind_is_recorded_with_the_instances_the_schedule_predicts(arena):
    from hazards.ragged_decode.kernel import build_sched, ragged_decode, read_profile

    k, v = arena
    grid = 20
    h = build_sched({}, {"k": k, "v": v}, CFG, 1, split_tokens=1024, grid=grid, profile=True)
    q, starts, lens = draw_call(LENS, 32, 128, torch.Generator().manual_seed(1), device="cuda")
    out = ragged_decode(h, q, starts, lens)
    p = read_profile(h)
    assert p.complete, p.summary()
    assert rel_err(out, reference_decode(q, k, v, starts, lens)) < 1e-2  # profiling changes no result
    counts = {s.task: 0 for s in p.spans}
    for s in p.spans:
        counts[s.task] += 1
    pieces = list(sched.pieces(lens.tolist(), sched.SPLIT, tile=1024))
    split_requests = {pc.req for pc in pieces if not pc.whole}
    names = {v: k for k, v in p.names.items()}
    assert counts[names["prologue"]] == grid and counts[names["worker"]] == grid
    assert counts[names["attend"]] == len(pieces)
    assert counts[names["merge"]] == len(split_requests)
    assert counts[names["fill"]] == 1
    life = {s.block: s for s in p.spans if s.task == names["worker"]}
    for s in p.spans:  # every span lies inside its block's lifetime, on the block that recorded it
        assert life[s.block].begin <= s.begin <= s.end <= life[s.block].end
    attend = p.stats(names["attend"])
    assert attend.slow_cta <= attend.wall and attend.sum_cta <= grid * attend.wall


def test_overflow_on_the_real_ring_is_counted_never_silent(arena):
    from hazards.engine import profiler
    from hazards.ragged_decode.kernel import build_sched, ragged_decode, read_profile

    k, v = arena
    q, starts, lens = draw_call(LENS, 32, 128, torch.Generator().manual_seed(1), device="cuda")
    full = build_sched({}, {"k": k, "v": v}, CFG, 1, grid=16, profile=True)
    small = build_sched({}, {"k": k, "v": v}, CFG, 1, grid=16, profile=True, ring_capacity=5)
    ragged_decode(full, q, starts, lens)
    ragged_decode(small, q, starts, lens)
    pf, ps = read_profile(full), read_profile(small)
    assert ps.claimed == pf.claimed == len(pf.spans) and len(ps.spans) == 5
    assert ps.dropped == pf.claimed - 5 and not ps.complete
    with pytest.raises(ValueError, match="incomplete"):
        profiler.summarize([ps])


def test_the_faithful_check_prints_lines_the_engine_judges(arena):
    from hazards.engine.outcome import Outcome
    from hazards.engine.targets import CommandTarget

    cmd = [sys.executable, "-m", "hazards.ragged_decode.faithful", "--lens-scale", "16", "--launches", "2"]
    ok = CommandTarget([*cmd, "--candidate", "production", "--workers", "64"], cwd=REPO).run(timeout=300)
    assert ok.outcome is Outcome.CLEAN, ok.reason
    tasks = {r["task"]: r for r in ok.evidence["faithful"]}
    assert {"prologue", "attend", "merge", "worker"} <= set(tasks) and tasks["attend"]["workers"] == 64
    bad = CommandTarget([*cmd, "--candidate", "incorrect"], cwd=REPO).run(timeout=300)
    assert bad.outcome is Outcome.MISMATCH and "FAITHFUL_RESULT cos" in bad.reason
    r = subprocess.run([*cmd, "--ring", "4"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "ring overflow" in r.stderr
