"""The file layout: bytes written by hz_tripwire.h's own store functions decode exactly."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from hazards.engine.tripwire import layout
from hazards.engine.tripwire.layout import decode, read_snapshot
from hazards.engine.tripwire.session import TripwireFile

ROOT = Path(__file__).resolve().parents[2]
STRIDE = 1024  # HZ_TW_SPIN_STRIDE default


def write_pattern(writer: Path, workers: int) -> bytes:
    with TripwireFile() as tw:
        r = subprocess.run([str(writer), str(workers)], env={**os.environ, **tw.env()}, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return tw.read()


@pytest.mark.parametrize("workers", [8, 41])
def test_pattern_written_by_the_c_header_round_trips(roundtrip_writer: Path, workers: int) -> None:
    snap = decode(write_pattern(roundtrip_writer, workers))
    h = snap.header
    assert snap.problem is None
    assert h is not None and h.valid
    assert (h.workers, h.slot_words, h.generation, h.mode_name, h.spin_stride, h.max_warps) == (
        workers, 16, 3, "host-only", STRIDE, 32)
    assert h.pid > 0 and h.launch_ns > 0
    assert len(snap.slots) == workers
    for s in snap.slots[: workers - 2]:
        w = s.worker
        assert s.current
        assert s.aux == tuple(0x1111111111111111 * (i + 1) + w for i in range(3))
        assert s.warp_masks() == {7: {"arrive": 0xF, "exit": 0x7}}
        if w % 4 == 0:
            assert s.done and not s.waiting
            continue
        assert (s.layer, s.phase, s.tile) == (w % 7, 1 + w % 5, w * 1000 + 7)
        if w % 4 == 1:
            assert s.waiting and s.bar_current
            assert (s.barrier, s.observed, s.expected, s.spins) == (9, w, 100 + w, 2 * STRIDE)
        elif w % 4 == 2:
            assert not s.waiting and s.bar_state == layout.BAR_PASSED
            assert (s.barrier, s.observed, s.expected, s.spins) == (12, 55, 55, STRIDE)
        else:
            assert not s.waiting and s.bar_state == layout.BAR_NONE
    stale, untouched = snap.slots[workers - 2], snap.slots[workers - 1]
    assert stale.written and not stale.current  # generation 2's word is not this launch's
    assert (stale.layer, stale.phase, stale.tile) == (5, 3, 77)
    assert not untouched.written and not untouched.current


def _c_defines() -> dict[str, int]:
    text = (ROOT / "standalone" / "include" / "hz_tripwire.h").read_text()
    return {m[0]: int(m[1], 0) for m in re.findall(r"#define (HZ_TW_\w+) (0x[0-9A-Fa-f]+|\d+)u?\b", text)}


def test_python_constants_mirror_the_c_header() -> None:
    d = _c_defines()
    assert d["HZ_TW_MAGIC"] == layout.MAGIC
    assert d["HZ_TW_VERSION"] == layout.VERSION and d["HZ_TW_LAYOUT"] == layout.LAYOUT
    assert d["HZ_TW_HEADER_BYTES"] == layout.HEADER_BYTES
    assert d["HZ_TW_SLOT_WORDS"] == layout.SLOT_WORDS and d["HZ_TW_MAX_WARPS"] == layout.MAX_WARPS
    assert (d["HZ_TW_W_POS"], d["HZ_TW_W_BAR"], d["HZ_TW_W_OBS_EXP"], d["HZ_TW_W_AUX"], d["HZ_TW_W_ARRIVE"],
            d["HZ_TW_W_EXIT"]) == (layout.W_POS, layout.W_BAR, layout.W_OBS_EXP, layout.W_AUX, layout.W_ARRIVE,
                                    layout.W_EXIT)
    assert (d["HZ_TW_PHASE_START"], d["HZ_TW_PHASE_DONE"]) == (layout.PHASE_START, layout.PHASE_DONE)
    assert (d["HZ_TW_BAR_WAITING"], d["HZ_TW_BAR_PASSED"]) == (layout.BAR_WAITING, layout.BAR_PASSED)
    for k, v in (("NONE", 0), ("REGISTERED", 1), ("SNAPSHOT", 2), ("HOST_ONLY", 3)):
        assert d[f"HZ_TW_MODE_{k}"] == v and layout.MODES[v].replace("-", "_").upper() == k


@pytest.mark.parametrize("data, problem", [
    (b"", "never opened"),
    (b"HZTW", "short file"),
    (b"\0" * 256, "bad magic"),
])
def test_garbage_is_reported_not_raised(data: bytes, problem: str) -> None:
    snap = decode(data)
    assert snap.problem is not None and problem in snap.problem
    assert snap.slots == []


def test_truncated_file_decodes_the_slots_it_holds(roundtrip_writer: Path) -> None:
    data = write_pattern(roundtrip_writer, 8)
    snap = decode(data[: 128 + 3 * 128 + 5])
    assert len(snap.slots) == 3 and "truncated" in (snap.problem or "")


def test_missing_file_is_a_problem_not_an_exception(tmp_path: Path) -> None:
    snap = read_snapshot(tmp_path / "gone")
    assert snap.problem == "tripwire file is gone"
