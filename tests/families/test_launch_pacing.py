"""A family's launch loop never queues more than kQueueDepth launches ahead of the GPU.

The heartbeat's tail event (standalone/common/harness_main.h) completes only after every
launch queued before it; a loop that queued its whole batch beat once per batch, a false
hang for a batch longer than the stall window (docs/stall.md). Checked on the CPU: the ring
of standalone/common/pace.h against a simulated GPU, and every family's launch loop read
from its source.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STANDALONE = ROOT / "standalone"
LAUNCH_LOOP = re.compile(r"for \(long i = 0; i < b\.launches; \+\+i\) \{")
# Families whose loop enqueues every launch without waiting for the GPU: they must pace.
QUEUEING = {"barrier_layout", "mma_pingpong", "ordering", "pipeline"}
# Families whose loop synchronizes the stream after each launch (the tripwire then names the
# launch that hangs): one launch in flight, nothing to pace. megakernel_layers does so in
# every validated batch (--once, --serve); its unvalidated --raw-loop has no heartbeat.
SYNCHRONIZING = {"deadlock", "megakernel_layers"}


@pytest.fixture
def pace_driver(tmp_path, gxx):
    exe = tmp_path / "pace_driver"
    subprocess.run([gxx, "-std=c++17", "-O1", "-o", str(exe), str(Path(__file__).parent / "pace_driver.cpp")],
                   check=True, capture_output=True, timeout=120)
    return exe


def drive(exe, depth: int, launches: int) -> dict:
    out = subprocess.run([str(exe), str(depth), str(launches)], capture_output=True, text=True, timeout=30,
                         check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("depth", [1, 4, 32])
@pytest.mark.parametrize("extra", [-1, 0, 1, 3 * 32 + 5])
def test_each_launch_past_the_depth_waits_for_the_one_depth_back_and_no_more_are_queued(pace_driver, depth, extra):
    launches = max(depth + extra, 0)
    got = drive(pace_driver, depth, launches)
    assert got["bad_wait"] is False
    assert got["waits"] == list(range(0, launches - depth))
    assert got["max_queued"] == min(launches, depth)


def test_queue_depth_is_what_the_harness_uses():
    """The depth pace.h justifies is the one Batch::launched passes and Runner sizes its ring by."""
    pace = (STANDALONE / "common" / "pace.h").read_text()
    harness = (STANDALONE / "common" / "harness.h").read_text()
    assert re.search(r"constexpr int kQueueDepth = (\d+);", pace)
    assert "pace_launch(\n        pace_, kQueueDepth, paced_++" in harness
    assert "cudaEvent_t pace_[kQueueDepth]" in harness
    assert "b.pace_ = pace_;" in harness


def launch_loops(family: str) -> list[str]:
    """The bodies of the family's `for (long i = 0; i < b.launches; ++i)` loops (comments
    blanked, braces in strings and comments not counted: the static checks' C scanner)."""
    from hazards.static import cscan

    bodies = []
    for path in sorted((STANDALONE / family).glob("*")):
        if path.suffix not in (".cu", ".h", ".cuh"):
            continue
        scanned = cscan.scan(path.read_text())
        for m in LAUNCH_LOOP.finditer(scanned.code):
            close = cscan._matching_paren(scanned.code, scanned, m.end() - 1)
            bodies.append(scanned.code[m.end():close])
    return bodies


@pytest.mark.parametrize("family", sorted(QUEUEING | SYNCHRONIZING))
def test_every_launch_loop_paces_once_per_launch_or_synchronizes(family):
    bodies = launch_loops(family)
    assert len(bodies) == 1, f"{family}: expected one launch loop, found {len(bodies)}"
    (body,) = bodies
    if family in SYNCHRONIZING:
        assert "cudaStreamSynchronize(b.stream)" in body
        assert "b.launched()" not in body
    else:
        assert body.count("b.launched();") == 1, f"{family}: one b.launched() per launch"
        assert body.rstrip().endswith("b.launched();"), f"{family}: b.launched() after the launch's last kernel"


def test_no_family_loop_over_launches_is_left_unclassified():
    """A new family with a launch loop must be put in QUEUEING or SYNCHRONIZING here."""
    with_loops = {d.name for d in STANDALONE.iterdir() if d.is_dir() and launch_loops(d.name)}
    assert with_loops == QUEUEING | SYNCHRONIZING


def _gaps_script():
    from tests.script_module import load_script

    return load_script(ROOT / "ci" / "gpu" / "long_batch_gaps.py")


@pytest.mark.parametrize("runs, rc", [
    ([("clean", None, 4.0)], 0),
    ([("clean", None, 4.0), ("hang", "stall", 1.02)], 1),
    ([("clean", None, 0.5)], 2),
    ([], 2),
])
def test_the_long_batch_check_fails_on_a_hang_and_on_a_batch_too_short_to_tell(tmp_path, capsys, runs, rc):
    """ci/gpu/long-batch-beats.sh's verdict (ci/gpu/long_batch_gaps.py) over a store's runs."""
    from hazards.engine.outcome import Outcome, RunResult
    from hazards.engine.store import Store

    db = tmp_path / "results.db"
    with Store(db) as store:
        cid = store.create_campaign("stress", {})
        for outcome, kind, seconds in runs:
            store.record_run(cid, RunResult(Outcome(outcome), "why", target="ordering", variant="pc_fixed",
                                            evidence={"progress": {"events": 40, "max_gap_s": 0.11}},
                                            metrics={"launches": 10000}, duration_s=seconds, error_kind=kind))
    assert _gaps_script().main(str(db)) == rc
    assert f"{len(runs)} runs" in capsys.readouterr().out
