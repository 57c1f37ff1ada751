"""The local executor: one loop per leased GPU, children on their lease's GPU, every run
stored, broken items dropped, SPRT stopping, nothing leaked."""
from __future__ import annotations

import sys

from campaign_fakes import fake_items_for, make_family

from hazards.engine.loop import StoreSink, WorkItem, run_local
from hazards.engine.leases import acquire_free, release_all
from hazards.engine.sources import Repeat, Rotation


def test_every_leased_gpu_runs_work_with_its_own_cuda_visible_devices(fake_gpus, store):
    fam = make_family(canary_fail_prob=1.0)
    items = fake_items_for(fam, list(fam.variants))
    leases, _ = acquire_free("test")
    try:
        cid = store.create_campaign("soak", {})
        stats = run_local(leases, Rotation(items), StoreSink(store, cid), budget_s=2.0)
    finally:
        release_all(leases)
    runs = store.runs(cid)
    assert len(runs) == sum(s.runs for s in stats) and len(runs) >= 6
    assert {s.gpu for s in stats} == {"0", "1"} and all(s.runs > 0 for s in stats)
    for sr in runs:
        r = sr.result
        assert r.gpu_uuid == f"GPU-fake-{r.metrics['cvd']}"  # the server ran on the lease's GPU
        assert r.metrics["variant"] == r.variant and r.target == "fakefam"
        assert (r.outcome.value == "mismatch") == (r.variant == "broken")
    # numbered in order; a number is skipped only where the budget cut a run in flight on
    # another GPU after it (the cut runs are never stored)
    seqs = sorted(sr.seq for sr in runs)
    assert len(set(seqs)) == len(seqs) and seqs[-1] <= len(runs) + sum(s.cut_short for s in stats)
    # the rotation gives every variant about the same GPU time
    busy = [sum(sr.result.duration_s for sr in runs if sr.result.variant == v.name) for v in fam.variants]
    assert max(busy) - min(busy) <= 2 * max(sr.result.duration_s for sr in runs)
    assert sum(s.launches for s in stats) == 10 * len(runs)


def test_a_slow_item_does_not_starve_the_fast_ones(fake_gpus, store):
    fam = make_family()
    fast, slow = fake_items_for(fam, list(fam.variants[:2]))
    slow.params["sleep_s"] = 0.25
    leases, _ = acquire_free("test", max_gpus=1)
    try:
        cid = store.create_campaign("soak", {})
        run_local(leases, Rotation([fast, slow]), StoreSink(store, cid), budget_s=2.0)
    finally:
        release_all(leases)
    fast_runs, slow_runs = store.runs(cid, variant=fast.variant), store.runs(cid, variant=slow.variant)
    busy_fast = sum(sr.result.duration_s for sr in fast_runs)
    busy_slow = sum(sr.result.duration_s for sr in slow_runs)
    longest = max(sr.result.duration_s for sr in fast_runs + slow_runs)
    # each gets about the same GPU time, so the fast one gets many more runs
    assert abs(busy_fast - busy_slow) <= longest + 0.05, (busy_fast, busy_slow, longest)
    assert len(fast_runs) > 2 * len(slow_runs) >= 2


def test_an_item_that_cannot_start_is_dropped_and_the_rest_goes_on(fake_gpus, store):
    fam = make_family()
    good = fake_items_for(fam, [fam.variants[0]])
    broken = WorkItem(target="nosuch", kind="server", argv=("/nonexistent/server",), timeout_s=5.0)
    source = Rotation(good + [broken])
    leases, _ = acquire_free("test", max_gpus=1)
    try:
        cid = store.create_campaign("soak", {})
        run_local(leases, source, StoreSink(store, cid), budget_s=6.0)  # 1.5 s was too short for 3 fake runs at load 17
    finally:
        release_all(leases)
    assert "nosuch" in source.dropped() and "errors in a row" in source.dropped()["nosuch"]
    errs = store.runs(cid, target="nosuch")
    assert len(errs) == 3 and all(sr.result.outcome.value == "error" for sr in errs)
    assert "command not found" in errs[0].result.reason
    assert len(store.runs(cid, target="fakefam")) > 3


def test_command_items_get_the_lease_environment_too(fake_gpus, store):
    code = "import os, sys; print('HZ_RESULT {\"ok\": true, \"cvd\": \"%s\"}' % os.environ['CUDA_VISIBLE_DEVICES'])"
    item = WorkItem(target="cmd", kind="command", argv=(sys.executable, "-c", code), timeout_s=10.0)
    leases, _ = acquire_free("test", max_gpus=1)
    try:
        cid = store.create_campaign("soak", {})
        run_local(leases, Repeat(item, 3), StoreSink(store, cid), budget_s=30)
    finally:
        release_all(leases)
    runs = store.runs(cid)
    assert runs and all(sr.result.outcome.value == "clean" for sr in runs)
    assert all(sr.result.metrics["cvd"] == "0" for sr in runs), runs[0].result.metrics


def test_clean_runs_leave_no_artifact_folder_behind(fake_gpus, store):
    fam = make_family(canary_fail_prob=1.0)
    items = fake_items_for(fam, [fam.variants[1], fam.variants[2]])  # fixed (clean), broken (mismatch)
    leases, _ = acquire_free("test", max_gpus=1)
    try:
        cid = store.create_campaign("soak", {})
        run_local(leases, Rotation(items), StoreSink(store, cid), budget_s=1.0)
    finally:
        release_all(leases)
    runs = store.runs(cid)
    clean = [sr for sr in runs if sr.result.outcome.value == "clean"]
    failed = [sr for sr in runs if sr.result.outcome.value == "mismatch"]
    assert clean and failed
    assert all(sr.result.artifact_dir is None for sr in clean)
    kept = {p.name for p in store.layout.artifacts(cid).iterdir()} if store.layout.artifacts(cid).exists() else set()
    assert kept == {f"run-{sr.seq:06d}" for sr in failed if sr.result.artifact_dir}
    assert not any(f"run-{sr.seq:06d}" in kept for sr in clean)
