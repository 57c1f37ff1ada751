"""The leased-campaign frame: every campaign runs on a lease (or the no-GPU pseudo-lease),
with telemetry of exactly the leased GPU, warm targets that live as long as the frame,
and the campaign's status and spec kept by it."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from campaign_fakes import FAKE_SERVER

from hazards.engine.campaign import COMPLETE, STOPPED, LeasedCampaign, NoGpuFree, NoGpuVisible
from hazards.engine.loop import WorkItem
from hazards.engine.leases import GpuLease, acquire, current_holders
from hazards.engine.outcome import HOST, Outcome

# A command that reports the GPU it was given, as a result line.
SHOW_GPU = (sys.executable, "-c", "import os, json; print('HZ_RESULT ' + json.dumps("
            "{'ok': os.environ.get('HZ_FAIL') != '1', 'cvd': os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}))")


def _lease(uuid: str) -> GpuLease:
    """A lease of a GPU that NVML knows (the fake NVML's GPU-aaaa), held by nobody."""
    return GpuLease("0", uuid, "test", Path(os.devnull), os.getpid(), HOST, time.time())


def test_repeat_runs_a_command_on_the_leased_gpu_with_that_gpus_telemetry(store, fake_nvml, tmp_path):
    with LeasedCampaign(store, [_lease("GPU-aaaa")]) as frame:
        assert frame.on_gpu and frame.describe() == "1 GPU(s): GPU-aaaa"
        s = frame.repeat(item=WorkItem("show", kind="command", argv=SHOW_GPU), n=3, timeout=20)
    assert s.status == COMPLETE and s.counts["clean"] == 3
    runs = store.runs(s.campaign_id)
    assert {r.result.metrics["cvd"] for r in runs} == {"GPU-aaaa"}
    assert all(r.result.evidence["telemetry"]["uuid"] == "GPU-aaaa" and r.result.gpu_uuid == "GPU-aaaa" for r in runs)
    spec = store.campaign(s.campaign_id).spec
    assert spec["sessions"][0]["gpus"][0]["uuid"] == "GPU-aaaa" and "GPU-aaaa" in spec["telemetry"]


def test_without_a_gpu_the_command_keeps_its_environment_and_no_telemetry(store, monkeypatch):
    monkeypatch.setenv("HZ_FAKE_GPUS", "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "as-the-user-set-it")
    with pytest.raises(NoGpuVisible, match="no usable GPU"):
        LeasedCampaign.acquire(store, "needs a gpu")
    with LeasedCampaign.acquire(store, "hazards run", without_gpu=True) as frame:
        assert not frame.on_gpu and frame.describe() == "no GPU"
        s = frame.repeat(item=WorkItem("show", kind="command", argv=SHOW_GPU), n=1, timeout=20)
    r = store.runs(s.campaign_id)[0].result
    assert r.metrics["cvd"] == "as-the-user-set-it" and "telemetry" not in r.evidence and r.gpu_uuid is None
    assert store.campaign(s.campaign_id).spec["sessions"][0]["gpus"] == []


def test_every_gpu_busy_is_one_line_naming_the_holder(store, fake_gpus):
    with acquire("0", "night soak"), acquire("1", "night soak"):
        with pytest.raises(NoGpuFree, match="leased by .*night soak") as e:
            LeasedCampaign.acquire(store, "hazards run", max_gpus=1)
    assert "\n" not in str(e.value)


def test_the_frame_holds_its_leases_until_it_closes_and_children_run_on_them(store, fake_gpus):
    with LeasedCampaign.acquire(store, "hazards run", max_gpus=1) as frame:
        assert len(current_holders()) == 1
        s = frame.repeat(item=WorkItem("show", kind="command", argv=SHOW_GPU, env={"HZ_FAIL": "1"}),
                         n=5, timeout=20, until_fail=True)
    assert current_holders() == {}
    assert s.status == STOPPED and s.n == 1 and s.stop_reason == "first failure at run 1"
    assert store.runs(s.campaign_id)[0].result.metrics["cvd"] == "0"


def test_warm_targets_outlive_a_campaign_and_die_with_the_frame(store, fake_gpus):
    server = WorkItem("fakefam", kind="server", argv=(sys.executable, str(FAKE_SERVER)), launches=2, timeout_s=10)
    with LeasedCampaign.acquire(store, "hazards stress", max_gpus=1) as frame:
        frame.warm(server)
        target = frame.target(server)
        for variant in ("fixed", "broken"):
            item = WorkItem("fakefam", variant=variant, kind="server", argv=server.argv, launches=2,
                            params={"variant": variant, "fail_prob": float(variant == "broken")})
            s = frame.repeat(item=item, n=2, timeout=10, kind="stress")
            assert s.counts["clean" if variant == "fixed" else "mismatch"] == 2
        assert target.spawns == 1 and target.pid is not None  # one server for both campaigns
        pid = target.pid
    assert target.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert [c.status for c in store.campaigns("stress")] == [COMPLETE, COMPLETE]


def test_a_server_that_cannot_start_is_one_user_error_before_any_run(store):
    from hazards.engine.errors import UserError

    dead = WorkItem("dead", kind="server", argv=(sys.executable, "-c", "import sys; sys.exit(4)"))
    with LeasedCampaign.on_cpu(store) as frame, pytest.raises(UserError, match="exited with code 4"):
        frame.warm(dead)
    assert store.campaigns() == []


def test_sink_writes_evidence_json_with_the_telemetry_for_kept_runs(store, fake_nvml):
    with LeasedCampaign(store, [_lease("GPU-aaaa")]) as frame:
        s = frame.repeat(item=WorkItem("show", kind="command", argv=SHOW_GPU, env={"HZ_FAIL": "1"}), n=1,
                         timeout=20, evidence_json=True)
    run = store.runs(s.campaign_id)[0].result
    assert run.outcome is Outcome.MISMATCH
    import json

    evidence = json.loads((Path(run.artifact_dir) / "evidence.json").read_text())
    assert evidence["outcome"] == "mismatch" and evidence["evidence"]["telemetry"]["uuid"] == "GPU-aaaa"
