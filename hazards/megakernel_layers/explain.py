"""What a hung megakernel_layers launch's tripwire says, in the family's own terms.

The engine's analysis (hazards.engine.tripwire.analysis) groups workers by the barrier they
wait at. This module adds what only the family knows: which workers the barrier's arrival
counter expects (the schedule, `model.Schedule`), so it can name the participants that
never arrived, and which hazard class the evidence points to. Every wait in the kernel
publishes, beside the watch, the arrival counter that feeds it (aux0: its value, aux1: what
completes it, aux2: the expert for W13_W2). Counters are never reset, so "arrived this
layer" is the value minus what the previous layers left: count - (want - participants).
More in docs/megakernel-layers.md.
"""
from __future__ import annotations

import collections
from typing import Any

from hazards.megakernel_layers import model as M

# barrier and phase ids (standalone/megakernel_layers/megakernel_layers_names.h)
BAR_LAYER_END, BAR_QKV_EPOCH, BAR_CHUNK_MERGE, BAR_ATTN_RELEASE, BAR_OPROJ, BAR_ROUTING, BAR_W13_W2 = range(1, 8)
BARRIER_NAMES = {1: "LAYER_END", 2: "QKV_EPOCH", 3: "CHUNK_MERGE", 4: "ATTN_RELEASE", 5: "OPROJ", 6: "ROUTING",
                 7: "W13_W2"}
NO_FEEDER = (1 << 64) - 1


def _ranges(ids: list[int]) -> str:
    """'40–64, 70' for [40..64, 70]."""
    ids = sorted(ids)
    out, start, prev = [], None, None
    for i in ids + [None]:
        if start is None:
            start = prev = i
        elif i is not None and i == prev + 1:
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}–{prev}")
            start = prev = i
    return ", ".join(out[:6]) + (", …" if len(out) > 6 else "")


def _layer(epoch: int, layers: int) -> tuple[int, int]:
    """(step, layer) of an epoch."""
    return (epoch - 1) // layers, (epoch - 1) % layers


def explain(snapshot: Any, params: dict[str, Any], defines: dict[str, int] | None = None) -> str | None:
    """The family clause for a hang, from the final tripwire snapshot and resolved params, in the build
    with these -D defines (None: the default build; they set its QKV tiles: M.qkv_tile_rows)."""
    if snapshot is None or snapshot.header is None or not snapshot.slots:
        return None
    workers = snapshot.header.workers
    sched = M.describe(params, workers, defines)
    layers = int(params["layers"])
    waiting = [s for s in snapshot.slots if s.waiting]
    if not waiting:
        return None
    by_bar: dict[tuple[int, int], list[Any]] = collections.defaultdict(list)  # (barrier, epoch) -> its waiters
    for s in waiting:
        by_bar[s.barrier, _epoch(s, sched)].append(s)
    # read the hang at its earliest epoch: every later wait depends on it (a worker waits only for tasks
    # earlier in every worker's order), and how many workers each later group holds is an accident of which
    # flag copy or rank stalled (a shared_line run left 52 at layer 0's W13_W2 and 52 at the next LAYER_END);
    # within that epoch, the first of the largest group, which the clauses below take in with the group
    # beside it (CHUNK_MERGE with ATTN_RELEASE)
    first = min(e for _, e in by_bar)
    (bar, epoch), main = max(((k, v) for k, v in by_bar.items() if k[1] == first), key=lambda group: len(group[1]))
    n_main = len(main)
    step, layer = _layer(epoch, layers)
    name = BARRIER_NAMES.get(bar, f"#{bar}")
    head = f"{n_main} of {workers} workers wait at {name} in layer {layer} (epoch {epoch})"
    if bar in (BAR_ATTN_RELEASE, BAR_CHUNK_MERGE):
        # campaign step (d) (MKL_CAMPAIGN_STEP >= 5, so steps 10, 14, 15, 21 and 22, production, too; 22 splits their heads): its merge workers
        # wait for the chunk count at CHUNK_MERGE, the others at ATTN_RELEASE; both watches carry
        # the chunk counter
        other = BAR_CHUNK_MERGE if bar == BAR_ATTN_RELEASE else BAR_ATTN_RELEASE
        beside = by_bar.get((other, epoch), [])
        if beside:
            head += (f" and {len(beside)} at {BARRIER_NAMES[other]}"
                     + (" (campaign step (d)'s merge workers)" if other == BAR_CHUNK_MERGE else ""))
        return head + "; " + _chunk_clause(main + beside, sched, params)
    if bar == BAR_ROUTING:
        return head + "; " + _routing_clause(main, waiting, sched, params, layers)
    if bar == BAR_W13_W2:
        return head + "; " + _w13_clause(main, sched, params)
    return head + f"; hazard switch {params.get('hazard')!r}: no family-specific reading of {name}"


def _epoch(slot: Any, sched: M.Schedule) -> int:
    """The epoch a watch waits for. Three watches wait for an arrival count (mkl_kernel.cuh):
    QKV_EPOCH for qkv_tiles x epoch, CHUNK_MERGE (campaign step (d)'s merge workers) for
    chunks x epoch, LAYER_END for row_workers x (epoch - 1); the others wait for an epoch."""
    per = {BAR_QKV_EPOCH: sched.qkv_tiles, BAR_CHUNK_MERGE: sched.chunks}.get(slot.barrier, 0)
    if per > 0:
        return -(-slot.expected // per)
    if slot.barrier == BAR_LAYER_END and sched.row_workers > 0:
        return slot.expected // sched.row_workers + 1
    return slot.expected


def _feeder(slots: list[Any]) -> tuple[int, int] | None:
    vals = [(s.aux[0], s.aux[1]) for s in slots if s.aux and s.aux[0] != NO_FEEDER and s.aux[1]]
    return max(vals) if vals else None


def _chunk_clause(main: list[Any], sched: M.Schedule, params: dict[str, Any]) -> str:
    feed = _feeder(main)
    expected_ranks = list(range(sched.chunks))
    missing = [c for c in expected_ranks if c >= sched.workers or not sched.serves_chunk(c)]
    counted = ""
    if feed is not None:
        value, want = feed
        arrived = sched.chunks - (want - value)
        counted = f"CHUNK_MERGE counted {arrived} of its {sched.chunks} arrivals"
        if arrived != sched.chunks - len(missing):
            counted += f" (the schedule predicts {sched.chunks - len(missing)})"
    hazard = params.get("hazard")
    if not missing:
        return (f"{counted or 'the merge never released'}; every chunk rank of the schedule should have "
                f"arrived (hazard switch {hazard!r})")
    parts = f"{counted}: chunk ranks {_ranges(missing)} never arrived" if counted else \
        f"chunk ranks {_ranges(missing)} never arrived at CHUNK_MERGE"
    absent = [c for c in missing if c >= sched.workers]
    if hazard == "chunk_supply" and absent:
        return (f"{parts} — chunk ranks {_ranges(absent)} have no worker (grid {sched.workers}): the chunk "
                f"count {sched.chunks} exceeds the worker supply and the host guard that rejects it is off "
                "(chunk count above worker supply)")
    if hazard == "participant_set":
        return (f"{parts} — they hold no QKV tile, and the chunk phase is nested inside the QKV rank guard: "
                f"only min(QKV tiles {sched.qkv_tiles}, workers {sched.workers}) workers reach a barrier that "
                f"counts {sched.chunks} chunks (the chunk count scales with the sequence: {sched.tokens} tokens) "
                "(participant set)")
    return f"{parts} — not the signature of hazard switch {hazard!r}"


def _routing_clause(main: list[Any], waiting: list[Any], sched: M.Schedule, params: dict[str, Any],
                    layers: int) -> str:
    feed = _feeder(main)
    epoch = main[0].expected
    others = [s for s in waiting if s not in main]
    late = [s for s in others if s.barrier == BAR_ATTN_RELEASE and s.expected > epoch]
    counted = ""
    if feed is not None:
        value, want = feed
        arrived = sched.row_workers - (want - value)
        counted = f"OPROJ counted {arrived} of {sched.row_workers} arrivals"
    missing = sorted(s.worker for s in others if s.barrier == BAR_ATTN_RELEASE)
    if not missing:
        return f"{counted or 'ROUTING was never published'}; no straggler found at ATTN_RELEASE"
    parts = (f"{counted}: worker{'s' if len(missing) > 1 else ''} {_ranges(missing)} never arrived at OPROJ"
             if counted else f"workers {_ranges(missing)} never arrived at OPROJ")
    hazard = params.get("hazard")
    if late and hazard == "snapshot_epoch":
        s = late[0]
        _, l_late = _layer(s.expected, layers)
        no_qkv = all(not sched.holds_qkv(x.worker) and not sched.serves_chunk(x.worker) for x in late)
        return (f"{parts}; {'they wait' if len(late) > 1 else 'it waits'} at ATTN_RELEASE for epoch {s.expected} "
                f"(layer {l_late}) while the merge of its own layer already released {s.observed} — the expected "
                f"epoch was snapshotted at layer entry as counter + 1 after that layer's merger had bumped it"
                + ("; a worker with no QKV tile and no chunk arrives at nothing before then, so nothing orders "
                   "its snapshot before the bump" if no_qkv else "")
                + " (snapshot epoch)")
    return f"{parts} — not the signature of hazard switch {hazard!r}"


def _w13_clause(main: list[Any], sched: M.Schedule, params: dict[str, Any]) -> str:
    hazard = params.get("hazard")
    experts = collections.defaultdict(list)
    for s in main:
        if s.aux and s.aux[2] < (1 << 63):
            experts[int(s.aux[2])].append(s)
    if not experts:
        return f"no expert recorded in the watch (hazard switch {hazard!r})"
    bits = []
    reverted = []
    for e, slots in sorted(experts.items()):
        value = max(s.aux[0] for s in slots)
        tiles = sched.w13_tiles
        got = value % tiles
        if got == 0 and value > 0:
            obs = min(s.observed for s in slots)
            reverted.append(e)
            bits.append(f"expert {e}: all {tiles} W13 tiles arrived (counter {value}), so its release fired, yet "
                        f"the flag reads {obs} < {slots[0].expected}")
        else:
            bits.append(f"expert {e}: {got} of {tiles} W13 tiles arrived")
    text = "; ".join(bits[:4]) + ("; …" if len(bits) > 4 else "")
    if reverted and hazard == "shared_line":
        shared = M.releases_sharing_counter_line(M.release_stride(hazard))
        return (f"{text} — no participant is missing: the release was reverted. Release flags "
                f"{_ranges(shared)} share the arrival counter's 64-B line (stride {M.release_stride(hazard)} B), "
                "and an L2 write-back of that line, still holding the old releases, landed on top of the "
                "write-through release (emulated: the AMD mechanism) (lost release, shared line)")
    return f"{text} — not the signature of hazard switch {hazard!r}"
