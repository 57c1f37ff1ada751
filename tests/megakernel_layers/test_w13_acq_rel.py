"""Campaign step (r) (MKL_CAMPAIGN_STEP 20, candidate step_r; step_p_r stacks step (p) on it): production (step
15) with the W13 arrival's gpu-scope fences as acq_rel fences (MKL_W13_ACQ_REL). Since promote21 production is
step 21 (step 15 + step (p) + step (r), step_p_r's code); step 20 stays step 15 with its switch, so "production"
below, on the CPU, is the step-15 build (BASE); production's own switches, conditions and code:
test_production_step22.py.

What the W13 emit sub-span holds (the profiler's SUB_GEMV point, after gemv_block's round barrier, to the task's
record), read in the harness build's SASS (nvcc 13.0, sm_90a, -split-compile=0): thread g < 44 sums its group's
partial from shared memory, SwiGLU (MUFU.EX2, MUFU.RCP and the division's slow-path check) and two STG.E; a block
barrier; the leader's 8 strong image loads (LDG.E.STRONG.SYS, spilled: 8 STL); the arrival's barrier; the
leader's __threadfence (MEMBAR.SC.GPU, ERRBAR, CGAERRBAR, CCTL.IVALL) and ATOMG.E.ADD.STRONG.GPU, its count to
shared memory, a barrier and every thread's LDS; on the expert's last arriver every thread's MEMBAR.SC.GPU
(acquire_fence) and the leader's second MEMBAR.SC.GPU (release_fanout) with no memory access between them, then
the 8 release stores (STG.E.STRONG.SYS). A few hundred instructions and three barriers: no spill reload or loop
that could take 8 us. Round 22's sub-spans (an H100, production, 132 workers; per instance from the raw rings)
say the emit is not a fixed cost: 12.5 us on tiles whose GEMV ended >= 12 us before the layer's last one, 7.1-7.8
in the middle, 9.2 on the last, the early tiles' emits ending with the W13 stream; step (o) removed the image
loads' round trip and the emit did not move (8.1 against 8.0). The same blocks' W2 wait, four dependent
ld.acquire.gpu (LDG.E.STRONG.GPU and CCTL.IVALL, no MEMBAR) with every release already out, took 1.4 us (median
of 841) while W2 streamed, and W2's arrival (the same fence and atomic) 2.4-7.3 us by position. The round trips
are cheap under load; the SC fence is what grows with it. The latest W2 starters are the workers whose own W13
emit ends last (13.5 us after the last W13 GEMV, the first at 5.5), and the W2 phase ends with them (37.1 us
after the last W13 GEMV; a worker's W2 takes 23.6): the late tiles' emits are on the layer's path.

Step (r): the arrival's release fence is fence.acq_rel.gpu (MEMBAR.ALL.GPU), and the last arriver's acquire and
its fan-out's release are one acq_rel fence of its leader (the other threads' acquire fences dropped: none reads
another block's data before the W2 wait's acquire poll and barrier). The PTX ISA: "fence.acq_rel is a
light-weight fence that is sufficient for memory synchronization in most programs ... fence.sc is a slower fence".

On the CPU: step 20 is production's switches plus MKL_W13_ACQ_REL alone; every preprocessor condition reads 20
as production with that switch; with the switch off its machine code is production's line for line; the W13
arrival's fences in the SASS (both kernel instances, the harness build and its -DHZ_PROFILER build); every other
fence of the kernel production's; the compiled static checks pass with production's polls; no function spills
more than production's. On a GPU (test_gpu.py): production's bits (default, grid64, small, stale_descriptor, for
step_r and step_p_r), shared_line still hangs with the reverted release, stale_release still corrupts.

Before step (r), MKL_CAMPAIGN_STEP 20 built production's code: the switch, fence and catalog tests fail there.
"""
from __future__ import annotations

import re
from collections import Counter

import pytest

from hazards.megakernel_layers import faithful as FA

from . import test_production_step22 as T22
from .sass_text import assert_spills_no_more_than, function_instances
from .test_merge_spread import (ROOT, assert_static_checks_pass_with_the_polls_of, family_cubin, listing_of,
                                without_comments)
from .test_w13_emit_lean import ATOMIC_ADD, IMAGE_LOAD, w13_arrival_spans

KERNEL = ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh"
STEP_R = {"MKL_CAMPAIGN_STEP": 20}
BASE = {"MKL_CAMPAIGN_STEP": 15}  # step (r)'s base, production's code until promote21
SWITCH = "MKL_W13_ACQ_REL"
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")
RELEASE_STORE = re.compile(r"\bSTG\.E\.STRONG\.SYS\b")  # st.global.wt: a release flag
FENCE = re.compile(r"\bMEMBAR\.(\w+)\.(\w+)\b")


def test_step_20_is_step_15_with_the_w13_acq_rel_switch_alone():
    T22.assert_step_is_step_15_with_its_switch_alone(20, SWITCH)
    step = T22._switches(STEP_R)
    assert step["MKL_ATTN_MMA"] == step["MKL_COPY_AHEAD"] == step["MKL_W2_QUANT_AHEAD"] == 1  # on production
    assert step["MKL_W13_EMIT_LEAN"] == step["MKL_ROUTER_WIDE"] == step["MKL_CHUNK_LEAN"] == 0
    # step_p_r: -D stacks step (p)'s switch on step 20
    both = T22._switches(dict(FA.candidate("step_p_r").defines))
    assert both[SWITCH] == both["MKL_ROUTER_WIDE"] == 1 and both["MKL_CHUNK_LEAN"] == 0


def test_every_preprocessor_condition_of_the_family_reads_step_20_as_step_15_with_the_switch():
    T22.assert_every_condition_reads_step_as_step_15_with(20, SWITCH)


def test_step_20_without_its_switch_is_step_15_line_for_line():
    prod = T22._sass_lines(BASE, "test-mkl-step-15-sass")
    T22._assert_same_sass(prod, T22._sass_lines({**STEP_R, SWITCH: 0}, "test-mkl-step-20-acq-rel-off"))
    assert prod != T22._sass_lines(STEP_R, "test-mkl-step-20")


def _instructions(body: str) -> list[str]:
    return [m.group(1) for line in body.splitlines() if (m := INSTRUCTION.match(line))]


def _w13_arrival(body: str) -> tuple[list[str], list[str]]:
    """(from the barrier before the W13 arrival's atomic to the atomic, from the atomic to the first of the 8
    release stores) of one kernel instance: the W13 arrival is the atomic add with the 8 image loads in the two
    barriers before it (every W13 leader loads them: step (o) is off here)."""
    ins = _instructions(body)
    found = []
    for j, i in w13_arrival_spans(ins):
        k = next(k for k in range(i + 1, len(ins)) if RELEASE_STORE.search(ins[k]))
        assert sum(bool(RELEASE_STORE.search(y)) for y in ins[k:k + 40]) == 8, ins[k:k + 40]
        arrival_bar = max(n for n in range(j, i) if "BAR.SYNC" in ins[n])
        found.append((ins[arrival_bar:i], ins[i + 1:k]))
    assert len(found) == 1, len(found)
    return found[0]


def _fences(lines: list[str]) -> list[str]:
    return [f"{m.group(1)}.{m.group(2)}" for x in lines if (m := FENCE.search(x))]


def _bodies(cubin) -> list[str]:
    bodies = [b for b in function_instances(listing_of(cubin), "mkl_megakernel") if ATOMIC_ADD.search(b)]
    assert len(bodies) == 2, len(bodies)  # the tripwire compiled in and out
    return bodies


@pytest.fixture(scope="module")
def harness_builds():
    return (family_cubin(BASE, "test-mkl-step-15-v", "-Xptxas=-v"),
            family_cubin(STEP_R, "test-mkl-step-20-v", "-Xptxas=-v"))


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "profiler"])
def test_step_20_w13_arrival_releases_and_acquires_with_acq_rel_fences_one_after_the_atomic(harness_builds,
                                                                                          profiled: bool):
    """Production's W13 arrival: MEMBAR.SC.GPU between the arrival's barrier and its atomic, and two more
    between the atomic and the release stores (every thread's acquire, the leader's release). Step 20:
    MEMBAR.ALL.GPU before the atomic and exactly one fence, MEMBAR.ALL.GPU with its CCTL.IVALL (the acquire's
    L1 invalidation), between the atomic and the release stores; no SC fence on that path. Both kernel
    instances, in the harness build and in its -DHZ_PROFILER build (the one the perf gate times)."""
    if profiled:
        prof = {"HZ_PROFILER": 1}
        builds = (family_cubin({**BASE, **prof}, "test-mkl-step-15-prof"), family_cubin({**STEP_R, **prof}, "test-mkl-step-20-prof"))
    else:
        builds = harness_builds
    for body in _bodies(builds[0]):
        before, after = _w13_arrival(body)
        assert _fences(before) == ["SC.GPU"] and _fences(after) == ["SC.GPU", "SC.GPU"], (_fences(before), _fences(after))
    for body in _bodies(builds[1]):
        before, after = _w13_arrival(body)
        assert _fences(before) == ["ALL.GPU"] and _fences(after) == ["ALL.GPU"], (_fences(before), _fences(after))
        at = next(n for n, x in enumerate(after) if FENCE.search(x))
        assert any("CCTL.IVALL" in x for x in after[at:at + 4]), after[at:at + 4]
        assert not any(RELEASE_STORE.search(x) or IMAGE_LOAD.search(x) for x in after[:at])  # nothing between


def test_step_20_keeps_every_other_fence_of_the_kernel(harness_builds):
    """The W13 arrival's three SC fences become two acq_rel fences; every other fence of each kernel instance
    (the other arrivals, the router's acquire, the publishes, the merge's) is production's MEMBAR.SC.GPU."""
    for prod, step in zip(_bodies(harness_builds[0]), _bodies(harness_builds[1])):
        p, s = Counter(_fences(_instructions(prod))), Counter(_fences(_instructions(step)))
        assert p["ALL.GPU"] == 0 and p["SC.GPU"] >= 6, p
        assert s == Counter({"SC.GPU": p["SC.GPU"] - 3, "ALL.GPU": 2}), (p, s)


@pytest.fixture(scope="module")
def spill_builds():
    """Steps 15 and 20 in the harness build from canonical_sources (family_cubin's `canonical`): their spills
    the same for any comment or layout of the same code and in any checkout (staged_sources' folder is named
    by the content, and its name re-rolls NVVM's cloning: see canonical_sources)."""
    return (family_cubin(BASE, "test-mkl-step-15-canon-v", "-Xptxas=-v", canonical=True),
            family_cubin(STEP_R, "test-mkl-step-20-canon-v", "-Xptxas=-v", canonical=True))


def test_step_20_spills_no_more_than_step_15_anywhere_but_the_tripwire_body(spill_builds):
    """Per function at its worst copy (spills_by_function), the plain kernel body included, both builds from
    canonical_sources (nvcc 13.0, at 608bae7: 462 / 1512 B of spill stores / loads against production's
    462 / 1516; sources differing only in comments, from another folder: 454 / 1728 against 454 / 1724); the
    tripwire instance's body is judged against its own build's plain body (test_tripwire_watch.py: 418 / 1300,
    as production's)."""
    assert_spills_no_more_than(spill_builds[0].log, spill_builds[1].log)


def test_the_spill_builds_sources_are_the_same_after_a_comment_only_edit():
    """What keeps the spill comparisons from flipping on a comment: canonical_sources' text of mkl_kernel.cuh
    is the same with a comment line added, a trailing comment added, a comment's text changed and a blank line
    dropped; string literals, a `//` inside one and backslash-continued lines are kept; code is not."""
    text = KERNEL.read_text()
    lines = text.splitlines(keepends=True)
    at = next(n for n, x in enumerate(lines) if x.startswith("//") and n > 100)
    blank = next(n for n, x in enumerate(lines) if not x.strip() and n > 100)
    code = next(n for n, x in enumerate(lines) if x.endswith(";\n") and "//" not in x and '"' not in x and n > 100)
    edits = (text + "// a comment\n", "/* a\n block */\n" + text,
             "".join(lines[:at] + ["// other words\n"] + lines[at + 1:]),
             "".join(lines[:blank] + lines[blank + 1:]),
             "".join(lines[:code] + [lines[code][:-1] + "  // trailing\n"] + lines[code + 1:]))
    for edited in edits:
        assert edited != text and without_comments(edited) == without_comments(text)
    assert without_comments(text.replace("THREADS", "THREADS + 0", 1)) != without_comments(text)
    sample = '#define A(x) \\\n\n  x // c\nconst char* s = "a // b /* c */"; char c = \'"\'; /* d\n e */ int y;\n'
    assert without_comments(sample) == ('#define A(x) \\\n\n  x\n'
                                        'const char* s = "a // b /* c */"; char c = \'"\';   int y;\n')


def test_step_20_passes_the_compiled_static_checks_with_step_15_polls():
    """An acq_rel MEMBAR of gpu scope is an acquire / release to the checks as the SC one is; no wait is added
    or moved."""
    assert_static_checks_pass_with_the_polls_of(20, 15)


def test_the_catalog_names_step_r_on_step_15_and_step_p_r_as_step_21_code():
    r, pr = FA.candidate("step_r"), FA.candidate("step_p_r")
    assert dict(r.defines) == STEP_R and r.params == ()
    assert dict(pr.defines) == {**STEP_R, "MKL_ROUTER_WIDE": 1} and pr.params == ()
    for c in (r, pr):  # measured in round 23: step (r) rejected alone, the pair's launch items met once
        assert "round 23" in c.what.lower() and "step 15's bits" in c.what
    # against production (step 22: step 21, step_p_r's code, + step (t)'s merge): step (r) lacks step (p)'s router
    # and step (t)'s merge, the pair step (t)'s merge (slower as step_21, its code)
    assert r.expected == "slower" and pr.expected == "slower" and "step 21's code" in pr.what
    assert "production's code" not in pr.what
    assert SWITCH in r.what and "MKL_ROUTER_WIDE" in pr.what
