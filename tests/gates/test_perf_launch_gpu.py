"""On a GPU: the perf gate's `launch` row, production against production with `--task launch`
at the fewest pairs the gate allows: every sample times the plain build (no profiler, tripwire
compiled out) beside the profiled launches, the row is there, one interval, and the verdict is
no-change. Both sides are one build, so one warm profiled and one warm plain server serve them
(the family's default build and its HZ_PROFILER build, both in final-gpu-tests.sh's pre-build)."""
from __future__ import annotations

import pytest

from hazards.engine.gpus import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no usable NVIDIA GPU (NVML/nvidia-smi found none)")]


def test_production_against_itself_on_the_plain_builds_launch_is_no_change(tmp_path):
    from hazards.engine.stats import min_pairs
    from hazards.gates import perf
    from hazards.megakernel_layers import faithful as FA

    repeats = min_pairs(0.95)  # one worker count, one single-metric row: one interval at 0.95 (6 pairs)
    out = perf.run_gate("megakernel_layers:production", ["megakernel_layers:production"], workers=[132],
                        repeats=repeats, tasks=["launch"], launches=1, plain_launches=10, timeout=120.0, wait_s=60.0,
                        store_path=tmp_path / "results.db")
    assert out["verdict"] == "no-change", perf.format_report(out)
    [point] = out["points"]
    launch = point["ratios"]["launch"]
    assert point["tasks"] == {"launch": "no-change"} and out["judged_tests"] == 1
    assert launch["single_metric"] and launch["task_id"] == FA.LAUNCH_TASK_ID and launch["judged"]
    assert 100.0 < launch["baseline_slowCTA_us"] < 5000.0, launch  # a decode step: hundreds of us
    assert point["cos"]["baseline"] > 0.99 and "worker" in point["ratios"]  # the profiled rows beside it


def test_each_build_refuses_the_other_builds_launches_in_one_line():
    """The plain build times plain launches only, the profiled build profiled ones only: each
    answers the other's request with one bad_request line and keeps serving."""
    import json
    import subprocess

    from hazards.family import build_harness

    asks = {(): ({"launches": 2, "ring": "/dev/null"}, "built without -DHZ_PROFILER: it times plain launches only"),
            (("HZ_PROFILER", 1),): ({"launches": 1, "ring": "/dev/null", "plain_launches": 3},
                                    "plain_launches are timed in the plain build")}
    for defines, (request, words) in asks.items():
        exe = build_harness("megakernel_layers", defines=dict(defines) or None)
        out = subprocess.run([str(exe), "--profile-serve"], input=json.dumps(request) + "\n" + json.dumps(
            {"launches": 0, "plain_launches": 0}) + "\n", capture_output=True, text=True, timeout=60)
        replies = [json.loads(line[len("MKL_PROFILE "):]) for line in out.stdout.splitlines()
                   if line.startswith("MKL_PROFILE ")]
        assert out.returncode == 0 and [r["status"] for r in replies] == ["bad_request", "bad_request"], out
        assert words in replies[0]["message"] and "nothing to do" in replies[1]["message"], replies
