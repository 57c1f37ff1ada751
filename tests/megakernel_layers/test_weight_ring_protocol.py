"""Campaign step (c)'s shared-memory ring (mkl_kernel.cuh: ring_issue, ring_units, gemv_ring),
re-stated step by step and run under every interleaving hypothesis draws of 16 warps and the
bulk copies in flight, with the mbarriers' phase semantics of PTX (a phase completes when its
arrivals and its transaction bytes are all in; try_wait.parity P passes once the barrier's
current phase parity differs from P). Checked: no deadlock; a warp reads a stage only while it
holds the unit that warp expects; a refill never overwrites a stage some warp has not finished
reading; over several calls (the unit count carried in Ring::units, barriers never
re-initialised). A protocol with the refill's wait removed, or with the wrong parity, fails.
"""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

STAGES, NWARPS = 4, 16  # RING_STAGES, NWARPS (mkl_kernel.cuh)


@dataclasses.dataclass
class Mbarrier:
    count: int
    completed: int = 0
    pending: int = -1
    tx: int = 0

    def __post_init__(self) -> None:
        self.pending = self.count

    def _check(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count

    def arrive(self, expect_tx: int = 0) -> None:
        self.tx += expect_tx
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the barrier's count in one phase"
        self._check()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._check()

    def try_wait(self, parity: int) -> bool:
        return (self.completed & 1) != parity


class Violation(AssertionError):
    pass


class Ring:
    def __init__(self, *, refill_waits: bool = True, parity_flip: bool = False, carry_units: bool = True) -> None:
        self.full = [Mbarrier(1) for _ in range(STAGES)]
        self.empty = [Mbarrier(NWARPS) for _ in range(STAGES)]
        self.stage: list[int | None] = [None] * STAGES   # the unit a stage holds (None: a copy in flight)
        self.readers: list[set[int]] = [set(range(NWARPS)) for _ in range(STAGES)]  # done with its unit
        self.in_flight: list[tuple[int, int]] = []  # (stage, unit) copies not landed yet
        self.units = 0
        self.refill_waits, self.parity_flip, self.carry_units = refill_waits, parity_flip, carry_units

    def issue(self, u: int) -> None:  # ring_issue
        s = u % STAGES
        if self.readers[s] != set(range(NWARPS)):
            raise Violation(f"unit {u} overwrites stage {s} before warps {set(range(NWARPS)) - self.readers[s]} "
                            "have read its previous unit")
        self.full[s].arrive(expect_tx=1)
        self.stage[s] = None
        self.readers[s] = set()
        self.in_flight.append((s, u))

    def land(self, i: int) -> None:  # the copy engine completes one copy
        s, u = self.in_flight.pop(i)
        self.stage[s] = u
        self.full[s].complete_tx(1)


def warp(ring: Ring, w: int, calls: list[tuple[int, int]]):
    """One warp's path through gemv_ring / ring_units for each call (nunits, units per round).
    Yields 'bar' at a block barrier, 'spin' while a wait has not passed."""
    for nunits, per_round in calls:
        yield "bar"  # __syncthreads: the previous call's Ring::units is stored
        u0 = ring.units
        if w == 0:
            for k in range(min(STAGES, nunits)):
                ring.issue(u0 + k)
        for k0 in range(0, nunits, per_round):
            for k in range(k0, min(k0 + per_round, nunits)):
                u = u0 + k
                s, parity = u % STAGES, (u // STAGES) & 1
                while not ring.full[s].try_wait(parity ^ ring.parity_flip):
                    yield "spin"
                if ring.stage[s] != u:
                    raise Violation(f"warp {w} reads stage {s} for unit {u} but it holds {ring.stage[s]}")
                yield "read"  # the shared-memory loads take time: other warps and copies move meanwhile
                if ring.stage[s] != u:
                    raise Violation(f"stage {s} was overwritten while warp {w} read unit {u}")
                ring.readers[s].add(w)
                ring.empty[s].arrive()
                if w == 0 and k + STAGES < nunits:
                    if ring.refill_waits:
                        while not ring.empty[s].try_wait(parity ^ ring.parity_flip):
                            yield "spin"
                    ring.issue(u + STAGES)
            yield "bar"  # the round's partial sums are complete
            yield "bar"  # emitted: the next round rewrites them
        if w == 0 and ring.carry_units:
            ring.units = u0 + nunits


def run(ring: Ring, calls: list[tuple[int, int]], choices: list[int]) -> None:
    """Steps the warps and the copies in the order `choices` picks. A warp whose wait did not
    pass sleeps until something else happens (the scheduler is fair, as the hardware is):
    nothing left to run then is a deadlock."""
    warps = [warp(ring, w, calls) for w in range(NWARPS)]
    at_bar: set[int] = set()
    done: set[int] = set()
    asleep: set[int] = set()
    i = 0
    while len(done) < NWARPS:
        if len(at_bar) + len(done) == NWARPS:
            at_bar.clear()
            continue
        runnable = [w for w in range(NWARPS) if w not in done | at_bar | asleep]
        options = [("w", w) for w in runnable] + [("copy", j) for j in range(len(ring.in_flight))]
        if not options:
            raise Violation(f"deadlock: warps {sorted(asleep)} wait, {sorted(at_bar)} at a block barrier")
        kind, which = options[choices[i % len(choices)] % len(options)]
        i += 1
        if kind == "copy":
            ring.land(which)
            asleep.clear()
            continue
        try:
            what = next(warps[which])
        except StopIteration:
            done.add(which)
            asleep.clear()
            continue
        if what == "spin":
            asleep.add(which)
        else:
            asleep.clear()
            if what == "bar":
                at_bar.add(which)
    assert not ring.in_flight


CALLS = st.lists(st.tuples(st.integers(1, 13), st.integers(1, 9)), min_size=1, max_size=4)
SCHEDULES = st.lists(st.integers(0, 1000), min_size=1, max_size=400)


@settings(max_examples=60, deadline=None)
@given(CALLS, SCHEDULES)
def test_the_ring_streams_every_unit_in_order_under_any_interleaving(calls, choices):
    run(Ring(), calls, choices)


def _finds_a_violation(ring_kwargs: dict) -> bool:
    import random
    rnd = random.Random(7)
    for _ in range(300):
        calls = [(rnd.randint(1, 13), rnd.randint(1, 9)) for _ in range(rnd.randint(2, 4))]
        try:
            run(Ring(**ring_kwargs), calls, [rnd.randint(0, 1000) for _ in range(400)])
        except Violation:
            return True
    return False


def test_the_check_fails_a_refill_that_does_not_wait_for_every_warp():
    assert _finds_a_violation({"refill_waits": False})


def test_the_check_fails_the_wrong_phase_parity():
    assert _finds_a_violation({"parity_flip": True})


def test_the_check_fails_a_unit_count_not_carried_across_calls():
    assert _finds_a_violation({"carry_units": False})
