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
        self.transcript: list[CommandOutput] = []

    def remaining(self) -> float:
        return 1e9

    def run(self, command: str, *, budget_s: float | None = None, record: bool = True) -> CommandOutput:
        queue = self.answers.get(command)
        assert queue, f"the collector sent {command!r}, which the H200 run did not"
        out = CommandOutput(command, queue.pop(0) if len(queue) > 1 else queue[0], 0.0, True)
        self.transcript.append(out)
        return out


def _no_source(s: str) -> str:
    return re.sub(r" `.*`$", "", s)


@pytest.mark.skipif(not RUNS, reason="no round-2 transcripts recorded")
@pytest.mark.parametrize("path", RUNS, ids=[p.parent.name for p in RUNS])
def test_replaying_the_h200_transcript_gives_the_same_diagnosis(path, monkeypatch):
    recorded = json.loads(gzip.open(path).read())["device"]
    sources = {(loc["file"], loc["line"]): loc["source"] for loc in recorded["locations"]}
    monkeypatch.setattr(device, "_read_source", lambda f, ln, cwd: sources.get((f, ln)))
    replay = Replay([c for c in recorded["commands"] if not c["command"].startswith(("attach", "thread apply"))])
    got = device.cuda_device_report(replay, cwd=None)
    assert got["stuck_at"] == recorded["stuck_at"]
    assert [_no_source(s) for s in got["sentences"]] == [_no_source(s) for s in recorded["sentences"]]
    assert [(loc["kind"], loc["where"], loc["warps"]) for loc in got["locations"]] == \
        [(loc["kind"], loc["where"], loc["warps"]) for loc in recorded["locations"]]
