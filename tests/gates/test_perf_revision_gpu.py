"""On a GPU: the layered megakernel's production at HEAD gated against production from the
working tree, at the fewest pairs the gate allows: both sides print results and the verdict
is no-change. HEAD is that of a git repository the test makes from the working tree's
kernel sources (one commit): a device's copy of the checkout may carry no git metadata, or
stale metadata whose HEAD is another kernel, where a verdict would say nothing."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from hazards.engine.gpus import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no usable NVIDIA GPU (NVML/nvidia-smi found none)"),
              pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")]


def test_production_at_head_against_the_working_tree_is_no_change(tmp_path, monkeypatch):
    from hazards import kernel_sources
    from hazards.engine.stats import min_pairs
    from hazards.gates import perf

    today = kernel_sources.standalone_dir()
    repo = tmp_path / "repo"
    shutil.copytree(today, repo / "standalone", ignore=shutil.ignore_patterns("__pycache__"))
    for args in (("init", "-q"), ("add", "-A"), ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    # the gate resolves and extracts @HEAD from this repository; the server builds from what it extracted
    monkeypatch.setattr(kernel_sources, "standalone_dir", lambda: repo / "standalone")
    # one worker count, one judged task (the whole block's span), 3 intervals at 0.99
    # family-wise: the fewest pairs that give an exact interval there (10)
    repeats = min_pairs(1 - 0.01 / 3)
    out = perf.run_gate("megakernel_layers:production@HEAD", ["megakernel_layers:production"], workers=[132],
                        repeats=repeats, conf=0.99, tasks=["worker"], launches=3, timeout=120.0, wait_s=60.0,
                        store_path=tmp_path / "results.db")
    assert out["baseline"] == f"megakernel_layers:production@{head}" and out["baseline_side"]["revision"] == head
    assert out["verdict"] == "no-change", perf.format_report(out)
    [point] = out["points"]
    assert point["pairs"] == repeats and point["cos"]["baseline"] is not None and point["cos"]["candidate"] is not None
    assert {"worker", "qkv", "moe_w13"} <= set(point["ratios"]), point["ratios"].keys()  # both sides' rows
