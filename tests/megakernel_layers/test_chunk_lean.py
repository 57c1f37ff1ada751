"""Campaign step (q) (MKL_CAMPAIGN_STEP 19, switch MKL_CHUNK_LEAN, candidate step_q): step 15 (production then;
"production" below: production's code until promote21, whose step 21 has step 15's chunk and merge)
with the attention chunk's and the merge's fixed costs cut, read in the machine code the GPU runs (the
harness build's flags, nvcc 13.0, sm_90a).

Production's chunk, after its block loop, is: a copy of q to shared memory and a block barrier before
the first K word is loaded (two dependent round trips before the first mma); every warp's (m, l, acc)
stored to shared memory, a barrier, then every thread 8-9 passes of an integer division, shared loads,
an expf and a 4-B store of the partial (the combine); the arrival: a barrier, the leader's fence and
atomic, its count stored to shared memory, a second barrier and every thread reading the count, which
no chunk worker uses since step (d). The last merge worker's publish: every thread fences, a barrier,
the leader fences again, then the flag. Step (q): q read from qbuf beside the first block's K words
(no copy, no barrier), the combine in the registers of each kv head's first warp (one barrier), the
partial by 8-B stores, the chunk's arrival without the read-back, the last merger's publish by its
leader with one fence. Production's operations in production's order (its bits: a GPU test); no wait
added or moved (the compiled static checks count production's polls). Without step (q) the switch
table, the catalog entry and every machine-code fact below fail (step 19 is then production's code).
"""
from __future__ import annotations

import re

import pytest

from hazards.megakernel_layers import faithful as FA

from . import test_production_step22 as P
from .sass_text import function_instances, spills_by_function, spills_grown
from .test_copy_ahead import _harness_build
from .test_merge_spread import assert_static_checks_pass_with_the_polls_of, listing_of

STEP_Q = {"MKL_CAMPAIGN_STEP": 19}
PROD = {"MKL_CAMPAIGN_STEP": 15}  # step 15's code, step (q)'s base (production's until promote21: test_production_step22.py)


def test_step_19_is_step_15_with_the_lean_chunk_switch_alone():
    P.assert_step_is_step_15_with_its_switch_alone(19, "MKL_CHUNK_LEAN")
    step = P._switches(STEP_Q)
    assert step["MKL_ATTN_MMA"] == step["MKL_COPY_AHEAD"] == step["MKL_MERGE_SPREAD"] == 1


def test_every_preprocessor_condition_reads_step_19_as_step_15_with_the_lean_chunk():
    """A raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give 19 what it gives 15 (step (q)'s base)."""
    P.assert_every_condition_reads_step_as_step_15_with(19, "MKL_CHUNK_LEAN")


@pytest.fixture(scope="module")
def builds():
    """(production's, step 19's) harness builds, ptxas -v in their logs."""
    return (_harness_build(PROD, "test-mkl-harness-step-15"), _harness_build(STEP_Q, "test-mkl-harness-step-19"))


def _ops(fn: str) -> list[str]:
    """The instructions of a listing (opcode with its modifiers, then the operands)."""
    return [m.group(1) for line in fn.splitlines()
            if (m := re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?(\S.*?)\s*;", line))]


GLOBAL_STORE = re.compile(r"^STG?\.E(\.64|\.128)?\s")  # global or generic (the harness build spells both)


def _chunks(listing: str) -> list[list[str]]:
    fns = [*function_instances(listing, "attend_chunkILi8ELi8E"), *function_instances(listing, "attend_chunkILi4ELi4E")]
    assert len(fns) == 4, len(fns)  # both shapes, in the kernel with the tripwire in and out
    return [_ops(f) for f in fns]


def test_step_q_chunk_has_one_block_barrier_and_writes_its_partial_by_8_byte_stores(builds):
    prod, step = (_chunks(listing_of(b)) for b in builds)
    for ops in prod:  # the q copy's barrier and the combine's; one 4-B store in the combine's loop
        assert sum(o.startswith("BAR.SYNC") for o in ops) == 2
        assert [GLOBAL_STORE.match(o).group(1) for o in ops if GLOBAL_STORE.match(o)] == [None]
    for ops in step:  # the combine's barrier only; (m, l) and 8 x 2 dims a lane
        assert sum(o.startswith("BAR.SYNC") for o in ops) == 1
        stores = [GLOBAL_STORE.match(o).group(1) for o in ops if GLOBAL_STORE.match(o)]
        assert stores == [".64"] * 9, stores
        assert not any(o.startswith("STS.128") for o in ops)  # no copy of q


def test_step_q_issues_q_beside_the_first_blocks_k_words_before_any_mma(builds):
    """Production: the q copy's loads, its stores and a barrier, then the block's 8 K words (two dependent
    round trips before the first mma). Step (q): q's 4 16-B loads and the K words with no barrier or mma
    between them (loaded in the loop: nvcc hoisted them above it, where the hi / lo split waited for q
    before the first K load)."""
    prod, step = (_chunks(listing_of(b)) for b in builds)
    for ops in prod:
        first_mma = next(i for i, o in enumerate(ops) if o.startswith("HMMA"))
        assert any(o.startswith("BAR.SYNC") for o in ops[:first_mma])
    for ops in step:
        first_mma = next(i for i, o in enumerate(ops) if o.startswith("HMMA"))
        head = ops[:first_mma]
        assert not any(o.startswith("BAR.SYNC") for o in head)
        q = [i for i, o in enumerate(head) if re.match(r"LDG\.E\.128 ", o)]  # plain loads: q
        k = [i for i, o in enumerate(head) if re.match(r"LDG\.E\.128\.STRONG\.GPU ", o)]  # ld.cg: K (and V)
        assert len(q) == 4 and len(k) >= 8, (len(q), len(k))
        # no q load waits for the mma's split before the K words go out: both sets in one straight run
        assert not any(o.startswith("F2FP") for o in head[:max(q[-1], k[7]) + 1])


def _body_after(listing: str, call: str, until: str) -> list[list[str]]:
    """For each kernel instance, its body's instructions from the last CALL of `call` to the first one
    matching `until` after it."""
    out = []
    for fn in function_instances(listing, "mkl_megakernel"):
        ops = _ops(fn)
        calls = [i for i, o in enumerate(ops) if o.startswith("CALL") and call in o]
        if not calls:
            continue
        end = next(i for i in range(calls[-1], len(ops)) if re.match(until, ops[i]))
        out.append(ops[calls[-1] + 1:end])
    assert len(out) == 2, len(out)
    return out


def test_step_q_chunk_arrival_does_not_read_its_count_back(builds):
    """After attend_chunk, up to the O-projection's prefetch: production's barrier, fence, atomic
    returning the count, its store to shared memory and a second barrier; step (q)'s barrier, fence and
    an atomic whose result is discarded (RZ: the leader does not wait for it), no second barrier."""
    prod, step = (_body_after(listing_of(b), "attend_chunkILi8ELi8E", r"UBLKPF") for b in builds)
    for ops in prod:
        atom = [o for o in ops if o.startswith("ATOMG.E.ADD")]
        assert len(atom) == 1 and ", RZ," not in atom[0] and sum(o.startswith("BAR.SYNC") for o in ops) == 2
    for ops in step:
        atom = [o for o in ops if o.startswith(("ATOMG.E.ADD", "RED"))]
        assert len(atom) == 1 and (atom[0].startswith("RED") or "PT, RZ," in atom[0]), atom
        assert sum(o.startswith("BAR.SYNC") for o in ops) == 1 and sum(o.startswith("MEMBAR") for o in ops) == 1


def test_step_q_last_merger_publishes_with_one_fence_of_its_leader(builds):
    """From the merge (merge_heads<64>) to ATTN_RELEASE's write-through store: production 3 barriers and 3
    fences (the arrival's, every thread's acquire, the publish's), step (q) 2 and 2."""
    prod, step = (_body_after(listing_of(b), "merge_headsILi64E", r"STG\.E\.STRONG\.SYS") for b in builds)
    for ops in prod:
        assert [sum(o.startswith(k) for o in ops) for k in ("BAR.SYNC", "MEMBAR")] == [3, 3], ops
    for ops in step:
        assert [sum(o.startswith(k) for o in ops) for k in ("BAR.SYNC", "MEMBAR")] == [2, 2], ops


def test_step_q_spills_no_more_than_step_15(builds):
    """ptxas -v, the harness build: no function of step (q) spills more than production's (at 775b882 the
    plain kernel body 442 / 1492 B of spill stores / loads against 462 / 1516; attend_chunk and merge_heads as
    production; at 8ff56a0, before the tripwire change, 434 / 1712 against 454 / 1724). The tripwire
    instance's body is left out (spills_grown) and judged against its own plain body in
    test_tripwire_watch.py: 398 / 1220 B at 775b882 (production's 418 / 1300). The merge's arrival keeps
    block_arrive's read-back: its leader alone deciding made the body spill ~100 B more."""
    prod, step = (spills_by_function(b.log) for b in builds)
    assert len([k for k in prod if "attend_chunk" in k or "merge_heads" in k]) == 4, sorted(prod)
    worse = spills_grown(prod, step)
    assert not worse, worse


def _longest_move_run(ops: list[str]) -> int:
    """The most register moves in a row (other integer instructions between them do not end a run)."""
    best = run = 0
    for o in ops:
        if re.match(r"(IMAD\.)?MOV(\.U32)? ", o):
            run += 1
            best = max(best, run)
        elif o.startswith(("FFMA", "SHFL", "LD", "ST", "BRA", "MUFU", "FMNMX", "FSETP")):
            run = 0
    return best


def test_step_q_merge_weighs_two_register_sets_in_turn_without_moving_a_batch(builds):
    """merge_heads<64>: production's loop ends each batch by moving the next batch's 34 registers into its
    one set (the moves wait for those loads, so the batch after is issued only once the next has
    landed: 38 moves in a row); step (q)'s loop weighs set A's batch, reissues set A, weighs set B's,
    reissues set B: two batch bodies (shuffles, loads twice production's) and no such run of moves."""
    prod, step = (_ops(function_instances(listing_of(b), "merge_headsILi64E")[0]) for b in builds)
    count = lambda ops, k: sum(bool(re.match(k, o)) for o in ops)  # noqa: E731
    assert _longest_move_run(prod) >= 34 and _longest_move_run(step) < 16, (_longest_move_run(prod), _longest_move_run(step))
    for k in (r"SHFL", r"LDG?\.E\.64 "):  # a generic or global 8-B load: the partials
        assert count(prod, k) > 0 and count(step, k) == 2 * count(prod, k), (k, count(prod, k), count(step, k))


def test_step_q_passes_the_compiled_static_checks_with_step_15_polls():
    assert_static_checks_pass_with_the_polls_of(19, 15)


def test_the_catalog_names_step_q_on_step_15():
    c = FA.candidate("step_q")
    assert dict(c.defines) == STEP_Q and c.params == () and c.expected == "slower"  # round 22: attn_merge
    assert "MKL_CHUNK_LEAN" in c.what and "production's bits" in c.what
