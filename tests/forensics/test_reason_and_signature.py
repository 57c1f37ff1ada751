"""A located hang becomes the run's reason, its stuck locations its signature (two hangs at
the same lines are one signature, whatever their counts), and `hazards repro` / `stats`
show it; with the tripwire, both diagnoses side by side."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from forensics_helpers import PROGRAMS, needs_ptrace, needs_py_spy
from hazards.engine.forensics.collector import MARKER, agreement, hang_markdown, hang_reason
from hazards.engine.outcome import Outcome, RunResult
from hazards.engine.signatures import signature_of
from hazards.engine.watchdog import HangContext, register_on_hang, run_collectors, unregister_on_hang

ROOT = Path(__file__).resolve().parents[2]


def _hang(stuck: list[str], sentence: str, reason: str = "timed out after 5s") -> RunResult:
    ev = {"collectors": {"hang_forensics": {MARKER: 1, "sentence": sentence, "stuck_at": stuck}}}
    return RunResult(Outcome.HANG, hang_reason(reason, ev), target="t", evidence=ev)


def test_same_stuck_lines_are_one_signature_whatever_the_counts():
    a = _hang(["k.cu:23 (spin)", "k.cu:26 (barrier)"], "blocks 0–131 (132 warps) spin at k.cu:23")
    b = _hang(["k.cu:26 (barrier)", "k.cu:23 (spin)"], "blocks 0–63 (64 warps) spin at k.cu:23",
              reason="timed out after 9s")
    c = _hang(["k.cu:24 (spin)", "k.cu:26 (barrier)"], "blocks 0–131 (132 warps) spin at k.cu:24")
    assert signature_of(a).key == signature_of(b).key
    assert signature_of(a).key != signature_of(c).key  # line numbers are the point: not normalised away
    assert signature_of(a).message == "stuck at k.cu:23 (spin), k.cu:26 (barrier)"


def test_the_forensics_sentence_is_the_reason_and_an_unlocated_hang_keeps_its_own():
    assert _hang(["x.py:3"], "host: MainThread waits in f (x.py:3)").reason == \
        "timed out after 5s: host: MainThread waits in f (x.py:3)"
    plain = RunResult(Outcome.HANG, hang_reason("timed out after 5s", {}), target="t")
    assert plain.reason == "timed out after 5s"
    assert signature_of(plain).message == "timed out after <n>s"


def test_passive_collectors_run_before_the_forensics_and_it_sees_their_output():
    order = []

    def late(ctx):
        order.append("late")
        return {"saw": sorted(ctx.collected), "deadline_set": ctx.deadline is not None}

    def early(ctx):
        order.append("early")
        return {"x": 1}

    register_on_hang(late, order=100)
    register_on_hang(early)
    try:
        ctx = HangContext(pid=1, pgid=1, argv=["x"], target="t", started_at=0.0, artifact_dir=None, env={})
        out = run_collectors(ctx, budget_s=5)
    finally:
        unregister_on_hang(late)
        unregister_on_hang(early)
    assert order == ["early", "late"]
    late_name = next(k for k in out if k.endswith("late"))
    assert out[late_name]["deadline_set"] and any(k.endswith("early") for k in out[late_name]["saw"])


def test_the_summary_keeps_blocks_that_are_not_on_the_gpu():
    from hazards.engine.forensics.collector import summarize

    locs = [{"kind": "spin"}, {"kind": "barrier"}, {"kind": "warpsync"}, {"kind": "running"}]
    dev = {"locations": locs, "stuck_at": ["k.cu:1 (spin)"],
           "sentences": ["a spin", "a barrier", "a warp sync", "a runner", "block 132 (1 of 133) of k are not on the GPU"]}
    sentence, stuck = summarize({"device": dev, "host": {}})
    assert sentence == "a spin; a barrier; a warp sync; block 132 (1 of 133) of k are not on the GPU; 1 more location"
    assert stuck == ["k.cu:1 (spin)"]


def test_a_summary_that_located_nothing_leads_with_the_tripwire_and_says_what_was_not_read():
    from hazards.engine.forensics.collector import UNKNOWN, summarize

    result = {"device": {}, "host": {}, "skipped": {"device": "no process of the run holds a GPU open"}}
    tw = {"sentence": "20 workers wait at barrier ATTN_RELEASE epoch 3", "counts": {"waiting": 20}}
    assert summarize(result, tw) == ("tripwire: 20 workers wait at barrier ATTN_RELEASE epoch 3 (not read: "
                                     "device: no process of the run holds a GPU open)", [])
    assert summarize(result) == (UNKNOWN + "device: no process of the run holds a GPU open", [])
    assert summarize(result, {"counts": {"waiting": 20}})[0].startswith(UNKNOWN)  # a tripwire without a sentence
    located = {"device": {"locations": [{"kind": "spin"}], "sentences": ["a spin"], "stuck_at": ["k.cu:1 (spin)"]},
               "host": {}}
    assert summarize(located, tw) == ("a spin", ["k.cu:1 (spin)"])  # the debugger's location comes first


def _device(blocks: str, count: int, where: str = "deadlock.cu:120", more: list | None = None) -> dict:
    locs = [{"kind": "spin", "warps": count, "blocks": blocks, "blocks_all": blocks, "block_count": count,
             "where": where}] + (more or [])
    return {"debugger": "/usr/local/cuda/bin/cuda-gdb", "locations": locs,
            "sentences": [f"blocks {blocks} ({count} threads in {count} warps) of k spin on a load at {where}"]}


def test_tripwire_and_debugger_are_compared_group_by_group():
    tw = {"sentence": "63 workers wait at barrier ATTN_RELEASE epoch 5 (observed 4); 1 straggler",
          "counts": {"waiting": 64, "running": 0, "never_started": 0}, "stragglers": [13]}
    straggler = {"kind": "spin", "blocks_all": "13", "block_count": 1, "where": "deadlock.cu:153"}
    assert agreement(tw, {"device": _device("0–12, 14–63", 63, more=[straggler])}) == (
        "agree (one worker per block): the tripwire's main wait (63 workers) = the debugger's 63 blocks polling "
        "at deadlock.cu:120; its stragglers (13) = the blocks polling elsewhere (13, at deadlock.cu:153)")
    wrong = {**straggler, "blocks_all": "14"}
    assert agreement(tw, {"device": _device("0–12, 15–63", 62, more=[wrong])}).startswith(
        "differ (one worker per block): the tripwire's main wait (63 workers) ≠ the debugger's 62 blocks")
    assert agreement({"counts": {}}, {"device": _device("0–62", 63)}).startswith("not compared")


def test_hang_md_shows_both_diagnoses_side_by_side():
    tw = {"sentence": "63 workers wait at barrier GRID epoch 2 (observed 1)", "counts": {"waiting": 63}}
    result = {"pid": 7, "sentence": "blocks 0–62 … at deadlock.cu:120", "device": _device("0–62", 63),
              "host": {}, "system": {"gpus": [], "nvml": "NVML not available", "kernel_log_xids": [],
                                     "nvml_xids": "no Xid watch was running"},
              "tripwire": {**tw, "agreement": agreement(tw, {"device": _device("0–62", 63)})},
              "seconds": {"device": 1.2}, "skipped": {}}
    md = hang_markdown(result, "deadlock")
    assert "| tripwire | debugger |" in md
    assert "| 63 workers wait at barrier GRID epoch 2 (observed 1) | blocks 0–62 (63 threads in 63 warps)" in md
    assert "agree (one worker per block): the tripwire's main wait (63 workers) = the debugger's 63 blocks" in md


def _repro(*args: str, store: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hazards", "repro", "--store", str(store), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


@needs_py_spy
@needs_ptrace
def test_repro_reports_where_a_python_program_hangs_and_stats_groups_the_hangs(tmp_path):
    store = tmp_path / "r.db"
    # two 1 s runs are a 2 s campaign: the whole of it for forensics, so that the second hang's
    # summary fits whatever the first full collection took on a loaded machine
    r = _repro("--timeout", "1", "--keep-going", "--max-runs", "2", "--forensics-share", "1", "--",
               sys.executable, str(PROGRAMS / "hung_python.py"), store=store)
    assert r.returncode == 1, r.stderr
    assert "run 1: hang — timed out after 1s: host: MainThread waits in" in r.stdout
    assert "wait_for_result (hung_python.py:14)" in r.stdout
    assert "hang report: " in r.stdout and (tmp_path / "artifacts" / "campaign-1" / "run-000001" / "hang.md").is_file()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stats = subprocess.run([sys.executable, "-m", "hazards", "stats", "--store", str(store), "--json"],
                           capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    sigs = json.loads(stats.stdout)["signatures"]
    assert [(s["count"], s["message"]) for s in sigs] == [(2, "stuck at hung_python.py:14")]


def test_repro_without_forensics_keeps_the_plain_reason(tmp_path):
    t0 = time.monotonic()
    r = _repro("--no-forensics", "--timeout", "1", "--", sys.executable, str(PROGRAMS / "hung_python.py"),
               store=tmp_path / "r.db")
    assert r.returncode == 1
    assert "run 1: hang — timed out after 1s\n" in r.stdout
    assert not (tmp_path / "artifacts" / "campaign-1" / "run-000001" / "hang.md").exists()
    assert time.monotonic() - t0 < 30


def test_a_bad_hang_budget_is_a_one_line_error(tmp_path):
    r = _repro("--hang-budget", "0", "--", "true", store=tmp_path / "r.db")
    assert r.returncode == 2 and "--hang-budget must be a positive, finite number of seconds" in r.stderr


def test_a_full_collection_that_ran_out_of_time_leads_with_the_tripwire_and_compares_nothing(tmp_path):
    """The first hang of an item got a full collection with no time left for the debugger: the
    hang's sentence and hang.md lead with what the tripwire located, and never say the debugger
    "found no warp in a poll loop" (it never looked)."""
    import types

    from hazards.engine.forensics.collector import _finish
    from hazards.engine.tripwire.session import MARKER

    tw = {MARKER: 1, "sentence": "20 workers wait at barrier ATTN_RELEASE epoch 1 (observed 0)",
          "counts": {"waiting": 20, "running": 0, "never_started": 0}}
    ctx = types.SimpleNamespace(plan=None, collected={"tripwire": tw}, artifact_dir=tmp_path, target="deadlock")
    no_time = "no time left in the hang budget for a debugger attach"
    result = _finish(ctx, {"pid": 7}, {7: {"skipped": "no time left in the hang budget"}}, {},
                     {}, {"device": no_time}, 0.0)
    assert result["sentence"].startswith("tripwire: 20 workers wait at barrier ATTN_RELEASE"), result["sentence"]
    assert no_time in result["sentence"]
    assert result["tripwire"]["agreement"] == f"not compared: the debugger did not look ({no_time})"
    md = (tmp_path / "hang.md").read_text()
    assert md.split("\n")[2] == result["sentence"]
    assert "found no warp" not in md and "side by side" not in md
    assert f"not compared: the debugger did not look ({no_time})" in md


def test_a_debugger_that_looked_and_found_no_poll_loop_still_says_so():
    tw = {"sentence": "63 workers wait at barrier GRID", "counts": {"waiting": 63}}
    device = {"debugger": "/usr/local/cuda/bin/cuda-gdb", "locations": [{"kind": "other", "where": "k.cu:3"}],
              "sentences": ["blocks 0–62 of k at k.cu:3"]}
    assert agreement(tw, {"device": device}) == "not compared: the debugger found no warp in a poll loop"


def test_a_summary_that_read_nothing_keeps_its_reason_and_hang_md_says_why_no_debugger_looked(tmp_path):
    """The rule of a hang given no collection holds for a summary of a native program: the
    reason stays the watchdog's, hang.md leads with the tripwire (else the last progress place)
    and why no debugger looked."""
    import types

    from hazards.engine.forensics.collector import _finish
    from hazards.engine.forensics.policy import SUMMARY, HangPlan
    from hazards.engine.tripwire.session import MARKER

    why = "this item's hang is already located: summary only (a new location gets the full collection)"
    tw = {MARKER: 1, "when": "hang", "sentence": "1056 workers wait at barrier GRID", "counts": {"waiting": 1056}}
    for collected, lead in [({"t": tw}, "tripwire: 1056 workers wait at barrier GRID"),
                            ({}, "the last progress event before the hang (not a debugger): launch 3, layer 0")]:
        ctx = types.SimpleNamespace(plan=HangPlan(SUMMARY, why, 1.0, ("deadlock", "broken_grid")), collected=collected,
                                    artifact_dir=tmp_path, target="deadlock", last_progress="launch 3, layer 0")
        result = _finish(ctx, {"pid": 7}, {}, {}, {}, {"full collection": why}, 0.0)
        assert result["sentence"] == ""
        assert (tmp_path / "hang.md").read_text().split("\n")[2] == f"{lead} (not read: full collection: {why})"


def test_a_full_collection_that_read_nothing_does_not_repeat_the_stalls_place_in_the_reason(tmp_path):
    """Every collector failed (a container without ptrace: no debugger attaches, no host stack):
    the sentence is the last progress event. A stall's reason already names that place, so it is
    not said twice; a timeout's reason does not, so it gains it."""
    import types

    from hazards.engine.forensics.collector import _finish
    from hazards.engine.progress import stall_reason

    place = "launch 3, layer 0, phase ATTN, barrier ATTN_RELEASE"
    ctx = types.SimpleNamespace(plan=None, collected={}, artifact_dir=tmp_path, target="t", last_progress=place)
    found = _finish(ctx, {MARKER: 1, "pid": 7}, {}, {"error": "ptrace: Operation not permitted"}, {}, {}, 0.0)
    ev = {"collectors": {"hang_forensics": found}}
    stall = stall_reason(1.0, place)
    assert hang_reason(stall, ev) == stall
    assert hang_reason("timed out after 5s", ev) == f"timed out after 5s: {found['sentence']}"
    assert place in found["sentence"]
