"""The tripwire's cost (the campaign bounds it at 1%, paired): round 20 measured the tripwire compiled in (no
file) at +1.21-1.25% on step 15, production, and writing at +1.36-1.77%. On the CPU (nvcc 13.0, sm_90a), read
in the harness build (the flags of the binary the GPU runs, -split-compile=0 among them: family_cubin), the
two kernel instances' hot functions have the same loop shape; what differed was the tripwire instance's body,
which spilled more than the plain one: step 15 438 / 1756 B of spill stores / loads against 454 / 1724, step
14 418 / 1456 against 410 / 1424, step 10 484 / 1604 against 480 / 1516 (ptxas -v).

The cause was the marks, not the watched wait: each mark's test `threadIdx.x == 0` was one more use of the
one thread-index value nvcc keeps for the whole body, which ptxas spilled and reloaded (26 LDL of one slot in
the tripwire body). A mark now reads %tid.x again (tw_leader: an asm volatile `mov %tid.x`, one per mark), and
ptxas re-reads SR_TID.X wherever the body needs the index: the tripwire body spills less than the plain one
(step 15: 418 / 1300 B). The plain instance has no mark, but ptxas compiles both instances in one module and
its choices for one move with the other (which callee it clones): production's plain body went from 454 /
1724 to 462 / 1516 B in /work/main (the numbers here; another checkout's folder moves ptxas's allocation a
little, since it follows nvcc's path-hashed internal names: production's PTX, which does not, is pinned in
production_ptx.json).

The diagnostic build MKL_TW_WATCH_INLINE=1 inlines the watched wait (`wait_ge_watched`, 12 call sites): its
plain instance is not the default build's (so a paired bench of the two does not time the same plain code),
and on production its tripwire body spills more than with the out-of-line watch (1384 against 1300 B), so the
watch stays out of line. (Before the marks' change, step (d)'s inlined body came within 20 B of its plain one
and step 14's spilled more than out of line, 1632 against 1456.) Numbers read earlier in a build without
-split-compile=0 (which the GPU never ran) said otherwise on several points: review17 corrected them.

After that change the cost measured larger (+2.2-2.4%, main 775b882, an H100): what is left between the bodies
is the watched waits' out-of-line calls and the marks. Two diagnostic builds take one away each (MKL_TW_NO_MARKS,
MKL_TW_NO_WATCH) for the bench's paired attribution, and candidate MKL_TW_FASTPATH polls inline until the watch's
first store would be due (HZ_TW_SPIN_STRIDE polls) before calling it; the tests at the end read their SASS.
"""
from __future__ import annotations

import re

import pytest

from .sass_text import function_instances
from .test_merge_spread import family_cubin, listing_of
from .test_router_topk_warp import SCRIPT, _mode

KERNEL = r"_ZN3mkl14mkl_megakernelILb{}EE"


# Campaign steps whose own spill tests build them with these flags, under these labels: the same build (cache).
CANDIDATE_LABELS = {17: "test-mkl-step-17-v", 18: "test-mkl-step-18", 19: "test-mkl-harness-step-19",
                    20: "test-mkl-step-20-v"}


def _build(defines: dict | None, label: str = "test-mkl-tw-watch"):
    """(SASS listing, ptxas -v log) of the family's source with `defines` (build cache)."""
    cubin = family_cubin(defines, label, "-Xptxas=-v")
    return listing_of(cubin), cubin.log


def _spills(log: str, tw: bool) -> tuple[int, int]:
    """(spill store bytes, spill load bytes) of one kernel instance's body, from ptxas -v."""
    m = re.search(KERNEL.format(int(tw)) + r"\S*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                  r"(\d+) bytes spill loads", log)
    assert m, log[:2000]
    return int(m.group(2)), int(m.group(3))


def _plain_instance(listing: str) -> str:
    """The plain (TW=false) kernel and its device functions' instructions, labels renumbered in
    order of appearance (the listing numbers them across the whole file)."""
    body = listing[listing.index(KERNEL.format(0)):listing.index(KERNEL.format(1))]
    labels: dict[str, str] = {}
    body = re.sub(r"\.L_x_\d+", lambda m: labels.setdefault(m.group(0), f".L{len(labels)}"), body)
    return "\n".join(l for l in body.splitlines() if ".size" not in l)


def _normalised(instance: str) -> list[str]:
    """An instance's instructions without addresses, line-info comments, column padding and the
    numbers of ptxas' copies of a function (`$N`): what differs in them is code."""
    out = []
    for line in instance.splitlines():
        if "//##" in line:
            continue
        line = re.sub(r"/\*[0-9a-f]+\*/", "", re.sub(r"\$\d+\)", ")", line))
        out.append(" ".join(line.split()))
    return out


@pytest.mark.parametrize("step", [14, 5], ids=["step_14", "step_d"])
def test_the_inlined_watch_changes_the_plain_instance_machine_code(step):
    """On step 14 and step (d) (where round 7 measured the cost), the inlined watch's build has another plain
    instance: a paired bench of it against the default build does not time the same plain code."""
    base = {"MKL_CAMPAIGN_STEP": step}
    prod, _ = _build(base)
    inl, _ = _build({**base, "MKL_TW_WATCH_INLINE": 1})
    assert "wait_ge_watched" in prod and "wait_ge_watched" not in inl
    assert _normalised(_plain_instance(inl)) != _normalised(_plain_instance(prod))


def test_on_step_15_the_out_of_line_watch_spills_less_than_the_inlined_one():
    """Step 15 (production from round 20 until promote21, where the choice was measured): the tripwire body
    spills less with the out-of-line watch than with it inlined (ptxas -v, the harness build: 1300 B of loads
    against 1384): the watch stays out of line. On step 18 (step (p); not asserted) the two are within 8 B, the
    inlined one the lower: 370 / 1176 B of spill stores / loads against 374 / 1184 (plain bodies 406 / 1452 and
    406 / 1448), and on step 21 (production from promote21 until step 22) alike: 370 / 1176 against 374 / 1184 (plain bodies
    406 / 1440 both), so the out-of-line watch stays as the rounds measured it; on step 22 (production since
    promote22) the inlined one is the higher: 386 / 1236 against 386 / 1224 (plain bodies 422 / 1464 and 422 /
    1460)."""
    base = {"MKL_CAMPAIGN_STEP": 15}
    _, out_of_line = _build(base)
    _, inl_log = _build({**base, "MKL_TW_WATCH_INLINE": 1})
    assert _spills(inl_log, tw=True)[1] > _spills(out_of_line, tw=True)[1]


@pytest.mark.parametrize("step, extra", [(None, {}), (21, {}), (15, {}), (14, {}), (10, {}), (17, {}), (18, {}), (19, {}),
                                         (20, {}), (None, {"MKL_TW_NO_WATCH": 1}), (None, {"MKL_TW_FASTPATH": 1})],
                         ids=["production", "step_21", "step_15", "step_14", "step_10", "step_o", "step_p", "step_q", "step_r",
                              "no_watch", "fastpath"])
def test_the_tripwire_body_spills_no_more_than_the_plain_one(step, extra):
    """Spill stores and loads of the tripwire instance's body at most the plain body's (ptxas -v, nvcc 13.0,
    the harness build; production is step 22, step_t's code, since promote22: 386 / 1224 against 422 / 1460;
    step 21, step_p_r's code, production from promote21 until step 22: 374 / 1184 against 406 / 1440, step_p_r's
    below). Before the marks read %tid.x again: step 15 (production then) 438 / 1756 B against 454 /
    1724, step 14 418 / 1456 against 410 / 1424, step 10 484 / 1604 against 480 / 1516; now 418 / 1300 against
    462 / 1516, 414 / 1236 against 414 / 1380, 416 / 1260 against 480 / 1516. (Step (d), no GPU run's build
    since step 10's promotion: 444 / 1284 against 436 / 1444, 8 B more stores.) The candidates on step 15,
    whose own spill tests leave the tripwire body out (sass_text.spills_grown): step (o) (17) 422 / 1300
    against 462 / 1516, step (p) (18) 374 / 1184 against 406 / 1448, step (q) (19) 398 / 1220 against 442 /
    1492 at 775b882; step (r) (20) 418 / 1300 against 462 / 1512 at 608bae7 (branch cand20). (Not here: step (i), 11, whose tripwire body stores 12 B more than its plain one, 440 /
    1276 against 428 / 1380.) The loads are the claim (each a dependent reload on the path); the stores get
    STORE_SLACK: ptxas's allocation follows nvcc's path-hashed internal names, and in another checkout
    (/work/wt/ci12b, `7e746ac`) step 14's tripwire body stored 414 B against its plain body's 410.
    On step 15 (production then), the diagnostic MKL_TW_NO_WATCH (the waits inline, the marks kept) 418 / 1388
    against 454 / 1724 and candidate MKL_TW_FASTPATH (inline polls before the watch) 430 / 1412 against 454 / 1724
    (their plain bodies are not production's: ptxas allocates both instances in one module); on step 21
    (production since promote21) 370 / 1176 and 406 / 1340 against 406 / 1440. Not here: the diagnostic
    MKL_TW_NO_MARKS, whose tripwire body, with no mark re-reading %tid.x, spills 422 / 1744 against 454 / 1724 on
    step 15, as production's did before tw_leader (20 B of loads more than its plain body), and 374 / 1464
    against 406 / 1440 on step 21 (24 B more)."""
    defines = {**({} if step is None else {"MKL_CAMPAIGN_STEP": step}), **extra} or None
    _, log = _build(defines, CANDIDATE_LABELS.get(step, "test-mkl-tw-watch") if not extra else "test-mkl-tw-watch")
    tw, plain = _spills(log, tw=True), _spills(log, tw=False)
    assert tw[1] <= plain[1] and tw[0] <= plain[0] + STORE_SLACK, (tw, plain)


STORE_SLACK = 16  # bytes of spill stores a checkout's folder moved (4 B seen); before tw_leader the loads failed (+32-88 B)


def test_each_mark_reads_the_thread_index_again_instead_of_reloading_it():
    """The tripwire body of production re-reads SR_TID.X (S2R) where it needs the thread index (83 reads in
    nvcc 13.0's build); before, it read it once, as the plain body does, and reloaded a spilled copy."""
    listing, _ = _build(None)
    bodies = {tw: max(function_instances(listing, KERNEL.format(tw)), key=len) for tw in (0, 1)}  # label, then body
    reads = {tw: len(re.findall(r"\bS2R R\d+, SR_TID\.X\b", body)) for tw, body in bodies.items()}
    assert reads[0] == 1 and reads[1] >= 17, reads  # 17 marks in the source


def test_no_mark_store_is_waited_for_by_a_fence_right_after_it():
    """A tripwire word is a 64-bit system-scope store to host memory (ST.E.64.STRONG.SYS, in the tripwire
    body only); a gpu-scope fence soon after it waits for it over PCIe. The router's mark stood two
    instructions before the router block's acquire fence (MEMBAR.SC.GPU), on the one block every worker
    then waits for, each layer; it now follows the fence. No mark store of production's tripwire body
    has a MEMBAR within the 32 instructions after it, unless a call (the router's work) comes first."""
    listing, _ = _build(None)
    bodies = {tw: max(function_instances(listing, KERNEL.format(tw)), key=len) for tw in (0, 1)}
    assert "ST.E.64.STRONG.SYS" not in bodies[0]
    ins = [l for l in bodies[1].splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", l)]
    stores = [i for i, l in enumerate(ins) if "ST.E.64.STRONG.SYS" in l]
    def fence_soon(i: int) -> bool:  # a MEMBAR within 32 instructions, no call (the work between) before it
        after = ins[i + 1:i + 33]
        call = next((k for k, l in enumerate(after) if "CALL" in l), len(after))
        return any("MEMBAR" in l for l in after[:call])

    fenced = [i for i in stores if fence_soon(i)]
    assert len(stores) >= 9 and not fenced, [ins[i] for i in fenced]


def test_the_step_f_round_benches_the_inlined_watch_beside_production():
    """The bench times each build with the tripwire compiled out and in (paired): the inlined
    watch's cost sits beside production's in the same run."""
    mode = _mode(SCRIPT.read_text(), "stepf-quick")
    assert re.search(r"quick_tail 7 step_f \"step_e step_f\" .*\bMKL_TW_WATCH_INLINE=1\b", mode)


# ---- the tripwire's cost, attributed (diagnostic builds) and a candidate (mkl_kernel.cuh, beside tw_mark) ------

WATCHED_CALL = r"CALL\.REL\.NOINC `\(\S*wait_ge_watched"
MARK_STORE = "ST.E.64.STRONG.SYS"  # a tripwire word to host memory
STRIDE = 0x400  # HZ_TW_SPIN_STRIDE (hz_tripwire.h): the watch's first store is at its 1024th failed poll


def _bodies(defines: dict | None) -> dict[int, str]:
    """{0: the plain instance's kernel body, 1: the tripwire instance's} of the harness build of `defines`."""
    listing, _ = _build(defines)
    return {tw: max(function_instances(listing, KERNEL.format(tw)), key=len) for tw in (0, 1)}


def _poll_loops(body: str) -> list[list[str]]:
    """The body's tight poll loops: a loop (sass_text.loop_bodies) of at most 24 instructions holding an acquire
    poll (LDG.E.STRONG.GPU); the layer and task loops around them are longer."""
    from .sass_text import loop_bodies

    return [lb for lb in loop_bodies(body) if len(lb) <= 24 and any("LDG.E.STRONG.GPU" in l for l in lb)]


def test_without_marks_the_tripwire_body_stores_no_mark_and_keeps_every_watched_call():
    """MKL_TW_NO_MARKS (diagnostic): the tripwire body's 17 marks compiled out, so no tripwire word is stored
    by the body and no mark re-reads %tid.x (production's: 10 mark stores, 83 S2R of SR_TID.X), while its waits
    call the watched wait as production's do (12 call sites)."""
    prod, no_marks = _bodies(None)[1], _bodies({"MKL_TW_NO_MARKS": 1})[1]
    assert prod.count(MARK_STORE) >= 9 and len(re.findall(WATCHED_CALL, prod)) == 12
    assert MARK_STORE not in no_marks and len(re.findall(r"\bS2R R\d+, SR_TID\.X\b", no_marks)) == 1
    assert len(re.findall(WATCHED_CALL, no_marks)) == len(re.findall(WATCHED_CALL, prod))


def test_without_the_watch_the_tripwire_body_polls_as_the_plain_one_and_keeps_every_mark():
    """MKL_TW_NO_WATCH (diagnostic): the tripwire instance's waits are the plain instance's inline poll loops
    (no call of wait_ge_watched: the build has no such function; as many tight poll loops as the plain body),
    and its marks store as production's do."""
    listing, _ = _build({"MKL_TW_NO_WATCH": 1})
    bodies = _bodies({"MKL_TW_NO_WATCH": 1})
    prod = _bodies(None)[1]
    assert "wait_ge_watched" not in listing and not _poll_loops(prod)
    assert len(_poll_loops(bodies[1])) == len(_poll_loops(bodies[0])) >= 5
    assert bodies[1].count(MARK_STORE) == prod.count(MARK_STORE)


def test_the_fastpath_polls_inline_up_to_the_watch_first_store_then_calls_the_watch():
    """MKL_TW_FASTPATH (candidate): each wait of the tripwire body polls inline, in a tight loop counted up to
    HZ_TW_SPIN_STRIDE (a compare with 0x400) that touches no watch state (no shared-memory access: production's
    watch counts every poll in shared memory), as many such loops as the plain body has poll loops; the watched
    wait is still called (after that loop), and every mark still stores. Production's tripwire body has no
    inline poll loop (every poll after the first is in wait_ge_watched)."""
    prod = _bodies(None)[1]
    plain, fast = _bodies({"MKL_TW_FASTPATH": 1}).values()
    loops = _poll_loops(fast)
    assert not _poll_loops(prod) and len(loops) == len(_poll_loops(plain)) >= 5
    for lb in loops:
        assert any(re.search(rf"ISETP\.\S+ P\d, PT, R\d+, {STRIDE:#x}, PT", l) for l in lb), lb
        assert not any(re.search(r"\b(LDS|STS)\b", l) for l in lb), lb
    assert re.findall(WATCHED_CALL, fast) and fast.count(MARK_STORE) == prod.count(MARK_STORE)
