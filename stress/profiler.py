"""Decode the per-task profiler ring (standalone/include/hz_profiler.h) into per-task spans.

A profiled launch leaves `claimed` (how many spans it tried to record) and a ring of
`capacity` records of four u64 words: begin, end, where = task (16) | SM (16) | block (32),
aux. Tasks are matched by their numeric id; names are optional metadata. More in docs/gates.md.
A record whose task field has SUB_FLAG set is a sub-span of a task (HZ_PROF_SUB_TASK: the
parent's id and the point's index): it goes to Profile.subspans, never among the spans, so the
per-task metrics (and every gate judging them) are the same with or without sub-spans. A sub-span
whose parent id (8 bits) or point index (7 bits) does not fit is written with point 0
(HZ_PROF_SUB_DROPPED): counted in Profile.subspans_dropped and said in its summary, never read as
another task's sub-span.
"""
from __future__ import annotations

import array
import dataclasses
import sys
from typing import Any, Iterable, Mapping, Sequence

VERSION = 1
RECORD_WORDS = 4
W_BEGIN, W_END, W_WHERE, W_AUX = 0, 1, 2, 3
SM_UNKNOWN = 0xFFFF
SUB_FLAG = 0x8000  # HZ_PROF_SUB_FLAG: task field = SUB_FLAG | point:7 << 8 | parent:8
SUB_DROPPED = SUB_FLAG  # HZ_PROF_SUB_DROPPED: a sub-span whose parent or point does not fit (point 0)
RECORD_BYTES = RECORD_WORDS * 8
METRICS = ("slowCTA", "wall", "sumCTA")


@dataclasses.dataclass(frozen=True)
class Span:
    """One recorded task instance on one block."""

    task: int
    sm: int
    block: int
    begin: int
    end: int
    aux: int

    @property
    def duration(self) -> int:
        return self.end - self.begin


@dataclasses.dataclass(frozen=True)
class SubSpan(Span):
    """One sub-span of a task instance (`task`: the parent's id; `aux`: the parent record's): from
    its previous reached point (or the task's origin) to point `point` (1-based, in the task's
    point order)."""

    point: int


@dataclasses.dataclass(frozen=True)
class TaskStats:
    """The faithful metrics of one task id over one launch, in timer ticks."""

    task_id: int
    name: str
    instances: int
    blocks: int
    slow_cta: int
    wall: int
    sum_cta: int

    def to_json(self, tick_ns: float = 1.0) -> dict[str, Any]:
        """Metrics in microseconds, keyed as in a FAITHFUL_RESULT line."""
        us = tick_ns / 1000.0
        return {"task_id": self.task_id, "task": self.name, "instances": self.instances,
                "blocks": self.blocks, "slowCTA_us": self.slow_cta * us, "wall_us": self.wall * us,
                "sumCTA_us": self.sum_cta * us}


@dataclasses.dataclass
class Profile:
    """A decoded ring: the spans, the overflow and anything wrong with the records."""

    spans: list[Span]
    claimed: int
    capacity: int
    names: dict[int, str]
    problems: list[str]
    subspans: list[SubSpan] = dataclasses.field(default_factory=list)
    # sub-spans written as HZ_PROF_SUB_DROPPED (their parent id >= 256 or point >= 128): Profile.subspans
    # lacks them. The per-task metrics never read sub-spans, so `complete` does not count them.
    subspans_dropped: int = 0

    @property
    def dropped(self) -> int:
        """Spans the launch tried to record that did not fit in the ring."""
        return max(0, self.claimed - self.capacity)

    @property
    def complete(self) -> bool:
        """Every span of the launch is in the ring and every record is sound."""
        return self.dropped == 0 and not self.problems

    def name_of(self, task: int) -> str:
        return self.names.get(task, f"task_{task}")

    def task_ids(self) -> list[int]:
        return sorted({s.task for s in self.spans})

    def stats(self, task: int) -> TaskStats:
        """The metrics of one task id (ValueError if it has no recorded span)."""
        spans = [s for s in self.spans if s.task == task]
        if not spans:
            raise ValueError(f"no span of task {task} ({self.name_of(task)}) in the profile")
        return TaskStats(task, self.name_of(task), len(spans), len({s.block for s in spans}),
                         max(s.duration for s in spans),
                         max(s.end for s in spans) - min(s.begin for s in spans),
                         sum(s.duration for s in spans))

    def all_stats(self) -> list[TaskStats]:
        return [self.stats(t) for t in self.task_ids()]

    def summary(self) -> str:
        """One line: spans kept, dropped, problems."""
        subs = f" and {len(self.subspans)} sub-spans" if self.subspans else ""
        text = f"{len(self.spans)} spans{subs} of {self.claimed} claimed (ring capacity {self.capacity})"
        if self.dropped:
            text += f"; OVERFLOW: {self.dropped} records dropped (spans or sub-spans), metrics are incomplete"
        if self.subspans_dropped:
            text += (f"; {self.subspans_dropped} sub-spans dropped (parent task id >= 256 or point >= 128: a "
                     "sub-span record cannot name them), sub-spans are incomplete")
        if self.problems:
            text += f"; {len(self.problems)} problem(s): {self.problems[0]}"
        return text


def _words(records: bytes | bytearray | memoryview | Sequence[int]) -> Sequence[int]:
    if isinstance(records, (bytes, bytearray, memoryview)):
        raw = bytes(records)
        if len(raw) % 8:
            raise ValueError(f"ring of {len(raw)} bytes is not a whole number of u64 words")
        words = array.array("Q")
        words.frombytes(raw)
        if sys.byteorder != "little":
            words.byteswap()
        return words
    return records


def decode(records: bytes | bytearray | memoryview | Sequence[int], claimed: int, *,
           capacity: int | None = None, names: Mapping[int, str] | None = None) -> Profile:
    """Decode one launch's ring. `records` holds at least capacity * 4 words (bytes or ints);
    `capacity` defaults to what `records` holds; `claimed` is the launch's counter."""
    words = _words(records)
    held = len(words) // RECORD_WORDS
    capacity = held if capacity is None else capacity
    if capacity < 0 or capacity > held:
        raise ValueError(f"capacity {capacity} but the ring holds {held} records")
    if claimed < 0:
        raise ValueError(f"claimed must be >= 0, got {claimed}")
    spans: list[Span] = []
    subspans: list[SubSpan] = []
    problems: list[str] = []
    subspans_dropped = 0
    for slot in range(min(claimed, capacity)):
        w = words[slot * RECORD_WORDS:(slot + 1) * RECORD_WORDS]
        begin, end, where, aux = (int(x) for x in w)
        if begin == 0 and end == 0 and where == 0:
            problems.append(f"slot {slot} was claimed but never written")
            continue
        task, sm, block = where >> 48, (where >> 32) & 0xFFFF, where & 0xFFFFFFFF
        if end < begin:
            problems.append(f"slot {slot} (task {task}, block {block}) ends before it begins")
            continue
        if task == SUB_DROPPED:
            subspans_dropped += 1
        elif task & SUB_FLAG:
            subspans.append(SubSpan(task=task & 0xFF, point=(task >> 8) & 0x7F, sm=sm, block=block,
                                    begin=begin, end=end, aux=aux))
        else:
            spans.append(Span(task=task, sm=sm, block=block, begin=begin, end=end, aux=aux))
    return Profile(spans, claimed, capacity, dict(names or {}), problems, subspans, subspans_dropped)


def median(values: Iterable[float]) -> float:
    vals = sorted(values)
    if not vals:
        raise ValueError("median of nothing")
    mid = len(vals) // 2
    return float(vals[mid]) if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2.0


def summarize(profiles: Sequence[Profile], tick_ns: float = 1.0) -> list[dict[str, Any]]:
    """Per task id over several launches of the same configuration: the median of each
    metric (µs), instances (median), launches it appeared in, and dropped spans (total).

    Raises ValueError when a profile is incomplete (overflow or bad records): medians of
    truncated rings would silently measure only what fit.
    """
    if not profiles:
        raise ValueError("no profiles to summarize")
    bad = [p.summary() for p in profiles if not p.complete]
    if bad:
        raise ValueError(f"{len(bad)} of {len(profiles)} profiled launches are incomplete: {bad[0]}")
    tasks = sorted({t for p in profiles for t in p.task_ids()})
    out = []
    for t in tasks:
        per = [p.stats(t).to_json(tick_ns) for p in profiles if t in p.task_ids()]
        row = {"task_id": t, "task": per[0]["task"], "launches": len(per),
               "instances": median(r["instances"] for r in per), "blocks": median(r["blocks"] for r in per)}
        for m in METRICS:
            row[f"{m}_us"] = median(r[f"{m}_us"] for r in per)
        out.append(row)
    return out


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of `summarize` rows (or TaskStats.to_json rows)."""
    head = f"{'id':>4} {'task':<12} {'inst':>6} {'blocks':>6} {'slowCTA_us':>11} {'wall_us':>10} {'sumCTA_us':>11}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['task_id']:>4} {r['task']:<12} {r['instances']:>6g} {r['blocks']:>6g} "
                     f"{r['slowCTA_us']:>11.2f} {r['wall_us']:>10.2f} {r['sumCTA_us']:>11.2f}")
    return "\n".join(lines)
