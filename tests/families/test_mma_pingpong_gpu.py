"""On a GPU (sm_90): family mma_pingpong's oracle end to end through one warm server.

Every clean variant (reference, fixed, fixed_threads, fixed_threads_skewed) stays bit-exact (and the reference within tolerance of the
host GEMM) at both trip-count parities and shapes; the exit-tail port fails at even trip
counts only; the one-bank refill by thread stores fails; the one-bank bulk refill and the
early accumulator read run clean as measured (their canaries are static: the bulk copy lands
after the in-flight wgmmas read, ptxas serialized the read).
"""
from __future__ import annotations

import pytest

from hazards.engine.gpus import gpu_available
from hazards.engine.outcome import Outcome
from hazards.families import get_family

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no usable NVIDIA GPU (NVML/nvidia-smi found none)")]

FAM = get_family("mma_pingpong")
LAUNCHES = 500


@pytest.fixture(scope="module")
def server():
    from hazards.engine.targets import ServerTarget
    from hazards.stress_family import family_binary

    t = ServerTarget([str(family_binary(FAM).resolve()), "--serve"], name="mma_pingpong")
    yield t
    t.close()


def _run(server, params, launches=LAUNCHES):
    r = server.run(params, timeout=FAM.timeout_s, launches=launches)
    assert r.outcome is not Outcome.ERROR, f"{params}: {r.reason}"
    return r


# every clean variant of the table: one added there is judged here without a list to update
@pytest.mark.parametrize("variant", [v.name for v in FAM.clean_variants])
@pytest.mark.parametrize("extra", [{"ktiles": 15}, {"ktiles": 16}, {"shape": "64x16", "ktiles": 7},
                                   {"shape": "256x64", "mma_reps": 16},
                                   {"stages": 2, "wait_depth": 0}])  # same kernel as the golden
def test_reference_and_fixed_are_bit_exact_at_both_parities(server, variant, extra):
    r = _run(server, {"variant": variant, **extra})
    assert r.outcome is Outcome.CLEAN, (r.reason, r.metrics)
    assert r.metrics["host_err"] <= r.metrics["host_tol"]


def test_the_single_exit_tail_fails_at_even_trip_counts_only(server):
    even = _run(server, {"variant": "broken_tail", "ktiles": 16}, 50)
    odd = _run(server, {"variant": "broken_tail", "ktiles": 15}, 50)
    assert even.outcome is Outcome.MISMATCH and even.metrics["mismatched"] == 50
    assert odd.outcome is Outcome.CLEAN


@pytest.mark.parametrize("extra", [{}, {"shape": "256x64", "mma_reps": 1}, {"blocks": 8}])
def test_the_one_bank_refill_by_thread_stores_fails_nearly_every_launch(server, extra):
    """The stores land while the group's last wgmmas still read the bank: measured on the
    H200, every launch wrong at these points; on an H100 (2026-12-05) 46 of 50 at 256x64 with
    mma_reps 1. The race is timing-dependent, so the test asks for most launches, not all."""
    r = _run(server, {"variant": "broken_war_threads", **extra}, 50)
    assert r.outcome is Outcome.MISMATCH and r.metrics["mismatched"] >= 40, r.metrics


def test_the_one_bank_bulk_refill_stays_invisible_at_run_time_as_measured(server):
    """Measured on the H200 (docs/results/mma-pingpong-h200.md): the one-bank bulk refill
    never changed a result, also with real wgmmas left in flight by the wait, because wgmma
    issue stalls until only the batch's tail is in flight, shorter than a bulk copy's
    latency. If this fails, the race has become observable: add "stress" to broken_war's
    detected_by (standalone/mma_pingpong/family.toml)."""
    r = _run(server, {"variant": "broken_war"}, 2000)
    assert r.outcome is Outcome.CLEAN, r.metrics


def test_the_early_accumulator_read_runs_clean_because_ptxas_serialized_it(server):
    r = _run(server, {"variant": "broken_acc_read", "stages": 1, "mma_reps": 16})
    assert r.outcome is Outcome.CLEAN, r.metrics
