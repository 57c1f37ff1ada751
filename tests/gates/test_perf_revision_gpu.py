"""On a GPU: the layered megakernel's production at HEAD gated against production from the
working tree, through the CLI, at the fewest pairs the gate allows: both sides print results
and the verdict is no-change (the same sources: HEAD's kernel tree is the working tree's, or
the test skips, since then a verdict would say nothing about the mechanism)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hazards.engine.gpus import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no usable NVIDIA GPU (NVML/nvidia-smi found none)")]
REPO = Path(__file__).resolve().parents[2]


def test_production_at_head_against_the_working_tree_is_no_change(tmp_path):
    from hazards.bisect.history import git
    from hazards.engine.errors import UserError
    from hazards.engine.stats import min_pairs
    from hazards.gates import perf
    from hazards.kernel_sources import standalone_dir

    try:
        head = perf.resolve_side("megakernel_layers:production@HEAD")
    except UserError as exc:  # e.g. a device copy of the tree without its .git
        pytest.skip(f"no git history to build a side from: {exc}")
    if git(standalone_dir(), "status", "--porcelain", "--", ".").strip():
        pytest.skip("the working tree's kernel sources differ from HEAD's: a verdict would not be an A/A one")
    # one worker count, one judged task (the whole block's span), 3 intervals at 0.99
    # family-wise: the fewest pairs that give an exact interval there
    repeats = min_pairs(1 - 0.01 / 3)
    r = subprocess.run([sys.executable, "-m", "hazards", "gate", "perf",
                        "--baseline", "megakernel_layers:production@HEAD", "--candidate", "megakernel_layers:production", "--workers", "132", "--repeats", str(repeats),
                        "--task", "worker", "--conf", "0.99", "--profiled-launches", "3", "--timeout", "120",
                        "--wait", "60s", "--store", str(tmp_path / "results.db"), "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["baseline"] == head and out["baseline_side"]["revision"] == head.rsplit("@", 1)[1]
    assert out["verdict"] == "no-change", out
    [point] = out["points"]
    assert point["pairs"] == repeats and point["cos"]["baseline"] is not None and point["cos"]["candidate"] is not None
    assert {"worker", "qkv", "moe_w13"} <= set(point["ratios"]), point["ratios"].keys()  # both sides' rows
