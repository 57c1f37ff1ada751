"""The profiler ring decoder: per-task metrics, overflow counted and reported, bad records
named; the C header's own host-compiled writer round-trips through it."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from hazards.engine import profiler
from hazards.engine.profiler import decode, summarize

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "standalone" / "include" / "hz_profiler.h"


def ring(spans: list[tuple[int, int, int, int, int]], capacity: int) -> tuple[bytes, int]:
    """(task, block, begin, end, aux) spans written like the device does: every span claims
    a slot, only slots below the capacity are stored."""
    words = [0] * (capacity * 4)
    for slot, (task, block, begin, end, aux) in enumerate(spans):
        if slot < capacity:
            words[slot * 4:slot * 4 + 4] = [begin, end, (task << 48) | (7 << 32) | block, aux]
    return struct.pack(f"<{len(words)}Q", *words), len(spans)


SPANS = [  # task 2 on three blocks, block 1 running it twice; task 3 once
    (2, 0, 1000, 1400, 0), (2, 1, 1100, 1300, 1), (2, 1, 1350, 1950, 2), (2, 2, 1200, 1250, 3),
    (3, 0, 2000, 2100, 9),
]


def test_metrics_per_task_id_follow_the_definitions():
    raw, claimed = ring(SPANS, capacity=16)
    p = decode(raw, claimed, names={2: "attend"})
    assert p.complete and p.dropped == 0 and p.task_ids() == [2, 3]
    s = p.stats(2)
    assert (s.name, s.instances, s.blocks) == ("attend", 4, 3)
    assert s.slow_cta == 600           # the slowest single instance (block 1's second)
    assert s.wall == 1950 - 1000       # max(end) - min(begin)
    assert s.sum_cta == 400 + 200 + 600 + 50
    assert p.stats(3).name == "task_3"  # unnamed ids still decode, by number
    assert p.stats(3).to_json(tick_ns=1.0)["slowCTA_us"] == pytest.approx(0.1)


def test_overflow_is_counted_and_makes_the_profile_incomplete():
    raw, claimed = ring(SPANS, capacity=3)
    p = decode(raw, claimed)
    assert len(p.spans) == 3 and p.claimed == 5 and p.dropped == 2
    assert not p.complete and "OVERFLOW: 2 records dropped" in p.summary()
    with pytest.raises(ValueError, match="incomplete"):
        summarize([p])


def test_a_claimed_but_unwritten_slot_and_an_inverted_span_are_problems_not_skipped():
    raw, _ = ring(SPANS[:2], capacity=4)
    p = decode(raw, 3)  # a third claim whose record never landed
    assert p.problems == ["slot 2 was claimed but never written"] and not p.complete
    raw, claimed = ring([(2, 0, 500, 400, 0)], capacity=1)
    p = decode(raw, claimed)
    assert p.spans == [] and "ends before it begins" in p.problems[0]


def test_summary_is_the_median_over_launches():
    launches = []
    for scale in (1, 3, 2):
        raw, claimed = ring([(t, b, 1000, 1000 + scale * d, 0) for t, b, _, d, _ in
                             [(2, 0, 0, 100, 0), (2, 1, 0, 300, 0)]], capacity=8)
        launches.append(decode(raw, claimed))
    [row] = summarize(launches, tick_ns=1000.0)  # ticks of 1 µs
    assert row["slowCTA_us"] == 600 and row["sumCTA_us"] == 800 and row["launches"] == 3


def test_bad_rings_are_value_errors():
    with pytest.raises(ValueError, match="whole number"):
        decode(b"\0" * 12, 0)
    with pytest.raises(ValueError, match="capacity"):
        decode(b"\0" * 32, 0, capacity=2)


def test_python_layout_constants_mirror_the_header():
    text = HEADER.read_text()
    consts = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define HZ_PROF_(\w+) (\d+|0x[0-9A-F]+)u",
                                                                  text.replace("0xFFFFu", "65535u"))}
    assert consts["VERSION"] == profiler.VERSION and consts["RECORD_WORDS"] == profiler.RECORD_WORDS
    assert (consts["W_BEGIN"], consts["W_END"], consts["W_WHERE"], consts["W_AUX"]) == (
        profiler.W_BEGIN, profiler.W_END, profiler.W_WHERE, profiler.W_AUX)
    assert consts["SM_UNKNOWN"] == profiler.SM_UNKNOWN
    assert consts["SUB_FLAG"] == profiler.SUB_FLAG


def _run_c_writer(tmp_path: Path, *args: str) -> bytes:
    """roundtrip_writer.c (the C header's host-side writer) compiled and run with `args`: its
    claimed count, then the ring. The test skips without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "writer"
    r = subprocess.run([cc, "-std=c99", "-Wall", "-Werror", f"-I{HEADER.parent}",
                        str(Path(__file__).with_name("roundtrip_writer.c")), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return subprocess.run([str(exe), *args], capture_output=True, check=True).stdout


@pytest.mark.parametrize("capacity,spans", [(16, 10), (6, 10)])
def test_records_written_by_the_c_header_round_trip(tmp_path: Path, capacity: int, spans: int):
    out = _run_c_writer(tmp_path, str(capacity), str(spans))
    claimed = struct.unpack_from("<Q", out)[0]
    p = decode(out[8:], claimed, capacity=capacity)
    assert p.claimed == spans and p.dropped == max(0, spans - capacity)
    for i, s in enumerate(p.spans):
        task, block = 1 + i % 3, i % 5
        assert (s.task, s.block, s.sm) == (task, block, 100 + block)
        assert s.begin == 1000 * (i + 1) + block and s.duration == 100 * task + i
        assert s.aux == 0xA0000000 + i


def test_sub_span_records_decode_apart_and_leave_the_task_metrics_as_they_were():
    """A record whose task field is HZ_PROF_SUB_TASK(parent, point) is a sub-span: kept in
    Profile.subspans with its parent and point, never among the spans the metrics read."""
    sub = lambda parent, point: profiler.SUB_FLAG | point << 8 | parent  # noqa: E731
    with_subs = SPANS + [(sub(2, 1), 0, 1000, 1100, 0), (sub(2, 2), 0, 1100, 1400, 0), (sub(3, 5), 0, 2000, 2100, 9)]
    raw, claimed = ring(with_subs, capacity=16)
    p = decode(raw, claimed)
    plain = decode(*ring(SPANS, capacity=16))
    assert p.complete and p.task_ids() == [2, 3] and p.spans == plain.spans
    assert summarize([p]) == summarize([plain])
    assert [(s.task, s.point, s.block, s.duration, s.aux) for s in p.subspans] == [
        (2, 1, 0, 100, 0), (2, 2, 0, 300, 0), (3, 5, 0, 100, 9)]
    assert "and 3 sub-spans of 8 claimed" in p.summary()
    # sub-spans count against the ring like any record: overflow is reported, not hidden
    raw, claimed = ring(with_subs, capacity=6)
    assert decode(raw, claimed).dropped == 2


@pytest.mark.parametrize("capacity,spans", [(64, 6), (10, 6)])
def test_sub_spans_written_by_the_c_header_round_trip(tmp_path: Path, capacity: int, spans: int):
    """hz_prof_write_points (what the device's hz_prof_commit_points stores after its one claim):
    the span, then a sub-span per reached point from the previous one, the last ending at the span's end."""
    out = _run_c_writer(tmp_path, str(capacity), str(spans), "points")
    claimed = struct.unpack_from("<Q", out)[0]
    p = decode(out[8:], claimed, capacity=capacity)
    assert claimed == sum(4 if i % 2 == 0 else 3 for i in range(spans))  # span + wait + (point 2) + last
    assert p.dropped == max(0, claimed - capacity)
    if p.dropped:
        return
    assert [s.task for s in p.spans] == [1 + i % 3 for i in range(spans)]
    for i, s in enumerate(p.spans):
        subs = [x for x in p.subspans if x.aux == s.aux]
        assert all(x.task == s.task and x.block == s.block and x.sm == s.sm for x in subs)
        if i % 2 == 0:
            assert [(x.point, x.begin, x.end) for x in subs] == [
                (1, s.begin - 50, s.begin), (2, s.begin, s.begin + 10), (3, s.begin + 10, s.end)]
        else:
            assert [(x.point, x.begin, x.end) for x in subs] == [(1, s.begin - 50, s.begin), (3, s.begin, s.end)]


def test_a_sub_span_whose_parent_id_does_not_fit_8_bits_is_counted_as_dropped_not_truncated(tmp_path: Path):
    """Parents 255, 256 and 257 (hz_prof_write_points of the C header): 255's sub-spans decode as 255's;
    256's and 257's are counted in Profile.subspans_dropped and said in the summary, never read as the
    sub-spans of tasks 0 and 1 (the 8-bit parent field truncated). The spans themselves keep their ids."""
    spans = 6
    out = _run_c_writer(tmp_path, "64", str(spans), "points", "255")
    claimed = struct.unpack_from("<Q", out)[0]
    p = decode(out[8:], claimed, capacity=64)
    assert p.dropped == 0 and p.complete  # the spans, and so the per-task metrics, are all there
    assert [s.task for s in p.spans] == [255 + i % 3 for i in range(spans)]
    assert {x.task for x in p.subspans} == {255}
    assert [x.point for x in p.subspans] == [1, 2, 3, 1, 3]  # spans 0 (even: 3 sub-spans) and 3 (odd: 2)
    assert p.subspans_dropped == 10 and len(p.subspans) + p.subspans_dropped == claimed - spans
    assert "10 sub-spans dropped (parent task id >= 256" in p.summary(), p.summary()
