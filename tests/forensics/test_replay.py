"""The device analysis replayed on real cuda-gdb transcripts from the H200 (round 2: every
command the collector sent during `hazards repro` hangs, with the debugger's answers, in
tests/forensics/data/h200-round2/<run>/hang.json). Feeding the same answers back must give
the same locations, kinds and sentences as the run on the H200 did."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from hazards.engine.forensics import device
from hazards.engine.forensics.debugger import CommandOutput

ROUND2 = Path(__file__).resolve().parent / "data" / "h200-round2"
RUNS = sorted(ROUND2.glob("*/hang.json.gz")) if ROUND2.is_dir() else []


class Replay:
    """Answers each command with what cuda-gdb answered on the H200 (in order per command)."""

    detach_reserve_s = 0.0

    def __init__(self, commands: list[dict]) -> None:
        self.answers: dict[str, list[str]] = {}
        for c in commands:
            self.answers.setdefault(c["command"], []).append(c["text"])
        self.texts = [c["text"] for c in commands if c["command"].startswith("x/")]
        self.ranges = [(int(m.group(1), 16), int(m.group(2), 16), c["text"]) for c in commands
                       if c["command"].startswith("info line")
                       for m in [re.search(r"starts at address (0x[0-9a-f]+).* and ends at (0x[0-9a-f]+)", c["text"])]
                       if m]
        self.transcript: list[CommandOutput] = []

    def remaining(self) -> float:
        return 1e9

    def run(self, command: str, *, budget_s: float | None = None, record: bool = True) -> CommandOutput:
        queue = self.answers.get(command)
        if not queue and command.startswith("info line *"):
            # an address the H200 run never asked about: cuda-gdb prints the same answer for
            # every address of one line-table range, so a recorded range holding it answers;
            # outside every recorded range: "no line information", as cuda-gdb says then
            addr = int(command.split("*")[1], 16)
            text = next((t for lo, hi, t in self.ranges if lo <= addr < hi), None)
            if text is None:
                sym = next((m.group(1) for t in self.texts
                            for m in [re.search(rf"0x{addr:x} <(.+?\+\d+)>:", t)] if m), None)
                text = f"No line number information available for address 0x{addr:x}" + (f" <{sym}>" if sym else "")
            out = CommandOutput(command, text, 0.0, True)
            self.transcript.append(out)
            return out
        assert queue, f"the collector sent {command!r}, which the H200 run did not"
        out = CommandOutput(command, queue.pop(0) if len(queue) > 1 else queue[0], 0.0, True)
        self.transcript.append(out)
        return out


# What each hang is, read by hand from its SASS (hang.md) and, for the deadlock variants,
# confirmed by the tripwire's diagnosis of the same run. Two differ from what the H200 run
# printed (docs/results/hang-forensics-h200.md): there, warps held at a
# `BAR.SYNC.DEFER_BLOCKING` stalled nine instructions later, on the outer loop's back
# branch, and were reported as spinning at that loop (deadlock.cu:67, and :138 as a loop
# without a load); `blocking_barrier` now names the BAR. Its line was never asked on the
# H200, so the replay names it by offset.
EXPECTED = {
    "spin-li": ["hung_kernels.cu:23 (spin)", "hung_kernels.cu:26 (barrier)", "hung_kernels.cu:26 (warpsync)"],
    "spin-noli": ["spin_on_flag+0xb0 (spin)", "spin_on_flag+0xc0 (warpsync)", "spin_on_flag+0xd0 (barrier)"],
    "gridbar-li": ["hung_kernels.cu:40 (sleep_spin)", "hung_kernels.cu:44 (barrier)", "hung_kernels.cu:44 (warpsync)"],
    "mbar-li": ["hung_kernels.cu:56 (mbarrier)", "hung_kernels.cu:61 (barrier)", "hung_kernels.cu:61 (warpsync)"],
    "torch": ["hung_kernels.cu:23 (spin)", "hung_kernels.cu:26 (barrier)", "hung_kernels.cu:26 (warpsync)"],
    "deadlock-broken_grid": ["(anonymous namespace)::grid_barrier_kernel+0xd00 (barrier)", "deadlock.cu:76 (spin)",
                             "deadlock.cu:81 (warpsync)"],
    "deadlock-broken_chunk": ["deadlock.cu:105 (spin)", "deadlock.cu:118 (spin)", "deadlock.cu:122 (barrier)",
                              "deadlock.cu:122 (warpsync)"],
    "deadlock-broken_epoch": ["(anonymous namespace)::epoch_kernel<0>+0x13e0 (barrier)", "deadlock.cu:153 (spin)",
                              "deadlock.cu:161 (spin)", "deadlock.cu:172 (warpsync)"],
}
# Poll locations, largest first: (blocks, warps) — against the tripwire of the same run:
# grid "1056 workers wait at barrier GRID; 1 worker never started"; chunk "20 workers wait
# at ATTN_RELEASE; 10 stragglers (waiting at CHUNK_MERGE)"; epoch "63 workers wait at
# ATTN_RELEASE; 1 straggler at MOE_W13_W2".
POLLS = {
    "deadlock-broken_grid": [("0–1055", 1056)],
    "deadlock-broken_chunk": [("10–29", 20), ("0–9", 10)],
    "deadlock-broken_epoch": [("0–12, 14–63", 63), ("13", 1)],
}


def _replay(path: Path, monkeypatch) -> tuple[dict, dict]:
    recorded = json.loads(gzip.open(path).read())["device"]
    sources = {(loc["file"], loc["line"]): loc["source"] for loc in recorded["locations"]}
    monkeypatch.setattr(device, "_read_source", lambda f, ln, cwd: sources.get((f, ln)))
    replay = Replay([c for c in recorded["commands"] if not c["command"].startswith(("attach", "thread apply"))])
    return recorded, device.cuda_device_report(replay, cwd=None)


@pytest.mark.skipif(not RUNS, reason="no round-2 transcripts recorded")
@pytest.mark.parametrize("path", RUNS, ids=[p.parent.name for p in RUNS])
def test_replaying_the_h200_transcript_names_every_stuck_location(path, monkeypatch):
    recorded, got = _replay(path, monkeypatch)
    name = path.parent.name
    assert got["stuck_at"] == EXPECTED[name]
    polls = [(loc["blocks"], loc["block_count"]) for loc in got["locations"] if loc["kind"] in device.POLL_KINDS]
    if name in POLLS:
        assert polls == POLLS[name]
    if recorded["stuck_at"] == EXPECTED[name]:  # where the H200 run was right, nothing changed
        assert got["sentences"] == recorded["sentences"]


def test_every_recorded_run_has_an_expectation():
    assert sorted(p.parent.name for p in RUNS) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(POLLS))
def test_the_debugger_agrees_with_the_tripwire_of_the_same_h200_run(name, monkeypatch):
    from hazards.engine.forensics.collector import agreement

    _, got = _replay(ROUND2 / name / "hang.json.gz", monkeypatch)
    tripwire = json.loads((ROUND2 / name / "tripwire.json").read_text())
    said = agreement(tripwire, {"device": got})
    assert said.startswith("agree (one worker per block)"), said


class OutOfTime(Replay):
    """The same answers, with the hang budget spent after `examine` PCs (the budget check runs
    once per PC group, before the group is examined)."""

    def __init__(self, commands: list[dict], examine: int) -> None:
        super().__init__(commands)
        self.left = examine

    def remaining(self) -> float:
        self.left -= 1
        return 1e9 if self.left >= 0 else 0.0


def _replay_out_of_time(name: str, examine: int, monkeypatch) -> dict:
    recorded = json.loads(gzip.open(ROUND2 / name / "hang.json.gz").read())["device"]
    monkeypatch.setattr(device, "_read_source", lambda f, ln, cwd: None)
    commands = [c for c in recorded["commands"] if not c["command"].startswith(("attach", "thread apply"))]
    return device.cuda_device_report(OutOfTime(commands, examine), cwd=None)


def test_a_debugger_out_of_time_before_any_pc_is_never_said_to_have_found_no_poll_loop(monkeypatch, tmp_path):
    """The debugger attached and listed the warps, then the hang budget ran out before it
    examined one PC: it did not look, so nothing is compared and hang.md says why."""
    import types

    from hazards.engine.forensics.collector import _finish, agreement
    from hazards.engine.tripwire.session import MARKER

    got = _replay_out_of_time("deadlock-broken_chunk", 0, monkeypatch)
    tripwire = json.loads((ROUND2 / "deadlock-broken_chunk" / "tripwire.json").read_text())
    said = agreement(tripwire, {"device": got})
    assert got["locations"] == [] and "found no warp" not in said, said
    assert said == ("not compared: the debugger did not look (it examined none of the 8 PCs it found: no time "
                    "left in the hang budget)")
    ctx = types.SimpleNamespace(plan=None, collected={"tripwire": {MARKER: 1, **tripwire}}, artifact_dir=tmp_path,
                                target="deadlock")
    result = _finish(ctx, {"pid": 7}, {}, got, {}, {}, 0.0)
    assert result["tripwire"]["agreement"].startswith("not compared: the debugger did not look (it examined none")
    assert result["sentence"].startswith("tripwire: "), result["sentence"]
    assert "examined none of the 8 PCs" in result["sentence"]
    md = (tmp_path / "hang.md").read_text()
    assert "found no warp" not in md and "side by side" not in md


def test_a_debugger_that_examined_some_pcs_says_how_many_and_never_calls_the_rest_a_difference(monkeypatch):
    from hazards.engine.forensics.collector import agreement

    got = _replay_out_of_time("deadlock-broken_chunk", 1, monkeypatch)
    tripwire = json.loads((ROUND2 / "deadlock-broken_chunk" / "tripwire.json").read_text())
    assert agreement(tripwire, {"device": got}) == ("not compared: the debugger found no warp in a poll loop in "
                                                    "the 1 of the 8 PCs it found (no time or location cap left "
                                                    "for the rest)")
    # three examined: one poll location, short of the tripwire's count: not "differ", the rest is unread
    got = _replay_out_of_time("deadlock-broken_chunk", 3, monkeypatch)
    said = agreement(tripwire, {"device": got})
    assert said.startswith("not compared in full (the debugger examined 3 of the 8 PCs"), said
