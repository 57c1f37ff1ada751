"""Turning one or two tripwire snapshots into a diagnosis a person can act on.

Input: the snapshot the on-hang collector took before the kill, optionally a second one
about a second later (to tell spinning workers from frozen ones), or one post-mortem
snapshot after a crash. Output: a `Diagnosis` whose `sentence` reads like
"237 workers wait at barrier ATTN_RELEASE epoch 1204 (observed 1203); 3 stragglers at
MOE_W13_W2 layer 11 — a producer never arrived", plus the groups, stragglers and
sentinels as JSON. More in docs/tripwire.md.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any

from ..tripwire.layout import Slot, Snapshot, tag_of
from ..tripwire.names import Names

LIST_MAX = 8  # worker ids listed per group before "…"


@dataclasses.dataclass
class Group:
    """Workers that share (phase, barrier, expected) while waiting, or (phase, layer) otherwise."""

    waiting: bool
    phase: int
    barrier: int | None
    expected: int | None
    workers: list[int]
    layers: dict[int, int]
    observed_min: int | None = None
    observed_max: int | None = None
    spinning: int | None = None  # None: no second snapshot to compare with
    frozen: int | None = None

    @property
    def cause(self) -> str | None:
        if not self.waiting or self.observed_max is None or self.expected is None:
            return None
        return "producer_never_arrived" if self.observed_max < self.expected else "stale_or_overrun"

    def to_json(self, names: Names) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["phase_name"] = names.phase(self.phase)
        d["barrier_name"] = names.barrier(self.barrier) if self.barrier is not None else None
        d["layers"] = {str(k): v for k, v in sorted(self.layers.items())}
        d["cause"] = self.cause
        return d


@dataclasses.dataclass
class Diagnosis:
    verdict: str
    sentence: str
    live: bool  # taken while the process was alive (on-hang) vs post-mortem
    generation: int = 0
    mode: str = ""
    workers: int = 0
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    groups: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stragglers: list[int] = dataclasses.field(default_factory=list)
    never_started: list[int] = dataclasses.field(default_factory=list)
    skewed: list[dict[str, int]] = dataclasses.field(default_factory=list)
    warp_masks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    interval_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_text(self) -> str:
        """The sentence, then one line per group and the notes (the .txt artifact)."""
        lines = [self.sentence, ""]
        lines.append(f"launch generation {self.generation}, {self.workers} worker slots, mode {self.mode or '?'}, "
                     + ("live snapshot" if self.live else "post-mortem snapshot")
                     + (f", second snapshot {self.interval_s:.2f} s later" if self.interval_s else ""))
        if self.counts:
            lines.append("workers: " + ", ".join(f"{k} {v}" for k, v in self.counts.items() if v))
        for g in self.groups:
            where = (f"wait at {g['barrier_name']} epoch {g['expected']} (observed "
                     f"{_range(g['observed_min'], g['observed_max'])})" if g["waiting"] else "running")
            motion = "" if g["spinning"] is None else f"; spinning {g['spinning']}, frozen {g['frozen']}"
            layers = ", ".join(f"L{k}×{v}" for k, v in g["layers"].items())
            lines.append(f"  {len(g['workers']):5d} at {g['phase_name']} [{layers}] {where}{motion}: "
                         f"workers {_ids(g['workers'])}")
        if self.never_started:
            lines.append(f"  never started: workers {_ids(self.never_started)}")
        for m in self.warp_masks:
            lines.append(f"  worker {m['worker']} point {m['point']}: warps arrived {m['arrive']}, exited {m['exit']}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _range(lo: int | None, hi: int | None) -> str:
    return "?" if lo is None else (f"{lo}" if lo == hi else f"{lo}–{hi}")


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:LIST_MAX])
    return shown + (f", … ({len(ids)} total)" if len(ids) > LIST_MAX else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _moved(a: Slot, b: Slot) -> bool:
    """Did the worker store anything between the two snapshots?"""
    return a.raw[:3] != b.raw[:3]


NO_BREADCRUMBS = "no_tripwire"  # the verdict of a file with no header or no worker slots


def analyze(first: Snapshot, second: Snapshot | None = None, names: Names | None = None,
            *, live: bool = True) -> Diagnosis:
    """Diagnose a hang or crash from one snapshot, or two taken `interval` apart."""
    names = names or Names()
    snap = second if (second is not None and second.header is not None) else first
    if snap.header is None or not snap.slots:
        why = snap.problem or "no worker slots"
        return Diagnosis(NO_BREADCRUMBS, f"no breadcrumbs: {why}", live)
    h = snap.header
    base = Diagnosis("", "", live, generation=h.generation, mode=h.mode_name, workers=h.workers)
    if snap.problem:
        base.notes.append(snap.problem)
    if h.generation == 0:
        base.verdict = "no_launch"
        base.sentence = (f"the tripwire was opened (mode {h.mode_name}, {h.workers} workers) but no launch went "
                         "through it: the program stopped before its first instrumented kernel")
        return base
    earlier = first if snap is second else None
    older = _older_launch(snap)
    if older is not None:  # launch G was queued behind a launch that is still running
        base.notes.append(f"launch {h.generation} was queued but no worker of it started; "
                          f"diagnosing launch {older}, the newest one with breadcrumbs")
        base.generation = older
        snap = snap.with_generation(older)
        earlier = earlier.with_generation(older) if earlier is not None else None
        if not any(s.waiting or (s.started and not s.done) for s in snap.slots):
            base.verdict = "kernel_never_started"
            base.generation = h.generation
            base.sentence = (f"kernel never started: launch {h.generation} wrote no breadcrumb "
                             f"(launch {older} before it had finished)")
            return base
    if earlier is not None and earlier.header is not None and earlier.header.generation != h.generation:
        base.verdict = "progressing"
        base.sentence = (f"not stuck in one kernel: launches {earlier.header.generation} → {h.generation} "
                         f"happened within {snap.taken_at - earlier.taken_at:.2f} s")
        return base
    if earlier is not None:
        base.interval_s = snap.taken_at - earlier.taken_at
    prev = {s.worker: s for s in earlier.slots} if earlier is not None else {}
    return _diagnose(base, snap.slots, prev, names)


def _older_launch(snap: Snapshot, lookback: int = 64) -> int | None:
    """The newest generation before the header's that stamped some slot, when none has the
    header's own tag (launches queued ahead of a hung one); None otherwise."""
    assert snap.header is not None
    if any(s.current for s in snap.slots):
        return None
    tags = {s.raw[0] >> 48 for s in snap.slots if s.raw[0] >> 63}
    g = snap.header.generation
    for older in range(g - 1, max(0, g - lookback), -1):
        if tag_of(older) in tags:
            return older
    return None


def _diagnose(d: Diagnosis, slots: list[Slot], prev: dict[int, Slot], names: Names) -> Diagnosis:
    never = [s.worker for s in slots if not s.started]
    done = [s for s in slots if s.done]
    waiting = [s for s in slots if s.waiting]
    running = [s for s in slots if s.started and not s.done and not s.waiting]
    d.never_started = never
    d.counts = {"never_started": len(never), "done": len(done), "waiting": len(waiting), "running": len(running)}
    if len(never) == len(slots):
        d.verdict = "kernel_never_started"
        d.sentence = (f"kernel never started: none of the {len(slots)} workers of launch {d.generation} "
                      "wrote a breadcrumb (launch failed, or an earlier kernel still holds the GPU)")
        return d
    if not waiting and not running:
        d.verdict = "finished" if not never else "never_resident"
        d.sentence = (f"all {len(done)} started workers finished launch {d.generation}"
                      + (f"; {_plural(len(never), 'worker')} never started" if never else "")
                      + ": the stall is outside the instrumented kernel")
        return d

    groups = _group(waiting, running, prev)
    d.groups = [g.to_json(names) for g in groups]
    main = groups[0] if groups[0].waiting else None
    in_main = set(main.workers) if main else set()
    stragglers = [s for s in waiting + running if s.worker not in in_main]
    d.stragglers = sorted(s.worker for s in stragglers)
    d.skewed = _skew(main, {s.worker: s for s in waiting}) if main else []
    d.warp_masks = _masks(stragglers + [s for s in waiting if s.worker in in_main and _frozen(s, prev)])

    parts: list[str] = []
    if main is not None:
        parts.append(f"{_plural(len(main.workers), 'worker')} wait at barrier {names.barrier(main.barrier or 0)} "
                     f"epoch {main.expected} (observed {_range(main.observed_min, main.observed_max)})")
    if stragglers:
        parts.append(_straggler_phrase(groups[1:] if main else groups, names))
    if never:
        parts.append(f"{_plural(len(never), 'worker')} never started (block never resident)")
    d.verdict, cause = _cause(main, stragglers, never, running)
    sentence = "; ".join(parts) + f" — {cause}"
    short = _short_barriers(groups, names)
    if short:
        sentence += "; " + "; ".join(short)
    if d.skewed:
        k = d.skewed[0]
        sentence += (f"; {_plural(len(d.skewed), 'worker')} of that group "
                     f"{'is' if len(d.skewed) == 1 else 'are'} at layer {k['layer']} while the rest are at layer "
                     f"{k['group_layer']}: the expected epoch was snapshotted a layer late (epoch snapshot skew)")
    d.sentence = sentence
    d.notes += _motion_notes(groups, prev, d.interval_s, names)
    return d


def _frozen(s: Slot, prev: dict[int, Slot]) -> bool:
    return s.worker in prev and not _moved(prev[s.worker], s)


def _group(waiting: list[Slot], running: list[Slot], prev: dict[int, Slot]) -> list[Group]:
    buckets: dict[tuple, list[Slot]] = collections.defaultdict(list)
    for s in waiting:
        buckets[(True, s.phase, s.barrier, s.expected)].append(s)
    for s in running:
        buckets[(False, s.phase, s.layer, None)].append(s)
    groups = []
    for (is_wait, phase, key, expected), members in buckets.items():
        g = Group(is_wait, phase, key if is_wait else None, expected, sorted(m.worker for m in members),
                  dict(collections.Counter(m.layer for m in members)))
        if is_wait:
            g.observed_min = min(m.observed for m in members)
            g.observed_max = max(m.observed for m in members)
        if prev:
            g.frozen = sum(1 for m in members if _frozen(m, prev))
            g.spinning = len(members) - g.frozen
        groups.append(g)
    # the biggest waiting group first; then stragglers, biggest first
    groups.sort(key=lambda g: (not g.waiting, -len(g.workers), g.phase))
    return groups


def _short_barriers(groups: list[Group], names: Names) -> list[str]:
    """Arrive-then-wait barriers whose every counted arrival is one of its waiters, still
    short of expected: nobody else is headed there (the participant set is too small)."""
    out = []
    for g in groups:
        n = len(g.workers)
        if g.waiting and g.expected is not None and g.observed_min == g.observed_max == n < g.expected:
            out.append(f"{names.barrier(g.barrier or 0)} counted {n} arrivals, all of them waiting there, of the "
                       f"{g.expected} it expects: fewer participants than the barrier counts")
    return out


def _skew(main: Group, by_worker: dict[int, Slot]) -> list[dict[str, int]]:
    if len(main.layers) < 2:
        return []
    top = max(main.layers.items(), key=lambda kv: (kv[1], kv[0]))[0]
    return [{"worker": w, "layer": by_worker[w].layer, "group_layer": top}
            for w in main.workers if by_worker[w].layer < top]


def _masks(slots: list[Slot]) -> list[dict[str, Any]]:
    out = []
    for s in slots:
        for point, m in sorted(s.warp_masks().items()):
            if m["arrive"] != m["exit"]:
                out.append({"worker": s.worker, "point": point, "arrive": hex(m["arrive"]), "exit": hex(m["exit"])})
    return out[:64]


def _straggler_phrase(groups: list[Group], names: Names) -> str:
    n = sum(len(g.workers) for g in groups)
    bits = []
    for g in groups:
        layers = "/".join(str(k) for k in sorted(g.layers))
        where = f"{names.phase(g.phase)} layer {layers}"
        if g.waiting:
            where += (f" (waiting at {names.barrier(g.barrier or 0)}, observed "
                      f"{_range(g.observed_min, g.observed_max)} of {g.expected})")
        bits.append((len(g.workers), where))
    if len(bits) == 1:
        return f"{_plural(n, 'straggler')} at {bits[0][1]}"
    return f"{_plural(n, 'straggler')}: " + ", ".join(f"{k} at {w}" for k, w in bits[:4]) + (
        ", …" if len(bits) > 4 else "")


def _cause(main: Group | None, stragglers: list[Slot], never: list[int], running: list[Slot]) -> tuple[str, str]:
    if main is None:
        return "stuck_outside_barrier", "no worker is in an instrumented wait: they stopped between marks"
    if main.cause == "stale_or_overrun":
        return ("stale_or_overrun", "observed ≥ expected but still waiting: a stale line or an epoch overrun")
    if never:
        return ("producer_never_arrived",
                "a producer never arrived: workers that never became resident cannot arrive "
                "(grid larger than co-residency?)")
    if not running:
        return ("producer_never_arrived",
                "a producer never arrived, and every live worker is waiting: nobody is left to arrive "
                "(participant set smaller than the barrier expects, or a circular wait)")
    return "producer_never_arrived", "a producer never arrived"


def _motion_notes(groups: list[Group], prev: dict[int, Slot], interval: float | None, names: Names) -> list[str]:
    if not prev or interval is None:
        return []
    frozen = sum(g.frozen or 0 for g in groups)
    total = sum(len(g.workers) for g in groups)
    if frozen == total:
        return [f"nothing moved in {interval:.2f} s: every unfinished worker is frozen (blocked outside its "
                "poll loop, or the context is gone)"]
    notes = []
    for g in groups:
        if g.waiting and g.frozen:
            notes.append(f"{g.frozen} of {len(g.workers)} workers waiting at {names.barrier(g.barrier or 0)} did not "
                         f"poll in {interval:.2f} s (stuck outside the poll loop, e.g. a warp missing at a block "
                         "barrier)")
        elif not g.waiting and g.frozen:
            notes.append(f"{g.frozen} of {len(g.workers)} workers at {names.phase(g.phase)} did not move in "
                         f"{interval:.2f} s (stuck outside any instrumented wait)")
    return notes
