"""Invariants of the device-side schedule the kernel relies on (pure-Python model)."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from hazards.ragged_decode import schedule as sched

CONTRACT_LENS = [65536] * 2 + [32768] * 4 + [16384] * 8 + [8192] * 16 + [4096] * 32 + [2048] * 66
CONFIGS = [(sched.GUIDED, 0), (sched.SPLIT, 2048), (sched.SPLIT, 0)]


def check_invariants(lens, kind, tile, phases=6, phase_chunks=132):
    ps = list(sched.pieces(lens, kind, tile, phases, phase_chunks))
    covered = Counter()
    for p in ps:
        assert 0 <= p.begin < p.end <= lens[p.req]
        for tok in range(p.begin, p.end):
            covered[(p.req, tok)] += 1
    assert all(n == 1 for n in covered.values())  # every token in exactly one piece
    assert len(covered) == sum(max(n, 0) for n in lens)
    slots = [p.slot for p in ps if not p.whole]
    assert len(slots) == len(set(slots))  # partial slots never collide
    assert all(s < sched.slot_capacity(lens, kind, tile, phases, phase_chunks) for s in slots)
    for req in range(len(lens)):  # a whole piece is the only piece of its request
        mine = [p for p in ps if p.req == req]
        assert not any(p.whole for p in mine) or len(mine) == 1
    return ps


def test_contract_lengths_are_covered_once_with_unique_slots():
    for kind, tile in CONFIGS:
        check_invariants(CONTRACT_LENS, kind, tile)


def test_per_request_schedule_gives_one_whole_piece_per_request():
    ps = check_invariants(CONTRACT_LENS, sched.SPLIT, 0)
    assert len(ps) == len(CONTRACT_LENS) and all(p.whole for p in ps)


def test_guided_chunks_shrink_and_split_the_longest_requests():
    chunks = sched.chunks(CONTRACT_LENS, sched.GUIDED, 0, 6, 132)
    sizes = [e - a for a, e in chunks]
    assert sizes[0] > 30 * sizes[-1] and sum(sizes) == sum(CONTRACT_LENS)
    ps = list(sched.pieces(CONTRACT_LENS, sched.GUIDED, 0, 6, 132))
    assert len({p.chunk for p in ps if p.req == 0}) > 10  # a 65536-token request is shared


def test_line_is_longest_first():
    order = sched.line_order([3, 9, 0, 9, 5])
    assert order == [1, 3, 4, 0, 2]


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(0, 300), min_size=1, max_size=24),
       kind=st.sampled_from(CONFIGS), phases=st.integers(1, 7), phase_chunks=st.integers(1, 40))
def test_random_lengths_keep_the_invariants(lens, kind, phases, phase_chunks):
    check_invariants(lens, kind[0], 7 if kind[1] else 0, phases, phase_chunks)
