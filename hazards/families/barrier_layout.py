"""Family `barrier_layout`: where the words of a release-flag + arrival-counter barrier live.

Seed 002_79daa8f540f6a64d.txt: eight write-through release flags at [0..7] and the L2
atomic arrival counter at [8] of one 64-B line; an L2 write-back reverted releases that had
fired and the waiters hung. Kernel: `standalone/barrier_layout/barrier_layout.cu`
(HIP-portable), variants by -D parameters; it embeds its own layout as `hz_barrier_layout`.

Static oracles, on real compiler output: the layout table read back from clang-19's gfx942
listing (64-B lines) and from nvcc's PTX (128-B lines, 32-B sectors) goes through
`hazards.static.layout`; the gfx942 listing through the AMDGCN release/acquire checks; the
sm_90a cubin (nvdisasm) through the SASS poll checks. The H200 runtime (correctness under
stress and the measured cost of sharing a line) is deferred: the harness is built, not run.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hazards.family import STANDALONE, Family, StaticVerdict, Variant
from hazards.static.variants import Points
from hazards.static import layout

SOURCE = STANDALONE / "barrier_layout" / "barrier_layout.cu"
RELEASES = 8
DEFAULTS: dict[str, Any] = {"slot_stride": 128, "done_offset": 16 * 128, "poll": 0}
DEFINE_NAMES = {"slot_stride": "HZ_SLOT_STRIDE", "done_offset": "HZ_DONE_OFFSET", "poll": "HZ_POLL"}
POLLS = {0: "acquire load", 1: "volatile load, no acquire", 2: "plain load (hoistable)"}

VARIANTS = (
    Variant("fixed", "fixed", "every barrier word on its own 128-B line, acquire poll", params={}),
    Variant("broken_shared_line", "broken", "seed layout: releases [0..7] and the counter [8] "
            "in one line (4-B stride)", params={"slot_stride": 4}, detected_by=("static",)),
    Variant("broken_false_sharing", "broken", "the consumers' done counter next to the "
            "producers' arrival counter", params={"done_offset": RELEASES * 128 + 4},
            detected_by=("static",)),
    Variant("broken_no_acquire", "broken", "consumers poll a volatile flag, then read data "
            "with no acquire", params={"poll": 1}, detected_by=("static",)),
    Variant("broken_hoisted_poll", "broken", "consumers poll a plain flag: nvcc hoists the load "
            "(certain hang); clang drops the empty loop (no wait at all)", params={"poll": 2},
            detected_by=("static",)),
)
POINTS = Points(DEFAULTS, VARIANTS, DEFINE_NAMES)
resolve = POINTS.resolve
defines = POINTS.defines


def model_layout(params: dict[str, Any], platform: str) -> layout.Layout:
    """The layout the kernel should build for these parameters (the model side)."""
    p = resolve(params)
    rows = [(x * p["slot_stride"], 4, 1, 0) for x in range(RELEASES)]
    rows += [(RELEASES * p["slot_stride"], 4, 0, 0), (p["done_offset"], 4, 0, 1)]
    return layout.layout_from_table(rows, platform)


def predicted_checks(params: dict[str, Any]) -> set[str]:
    """The failing check ids this point must trigger (empty = clean)."""
    p = resolve(params)
    out = {f.check for plat in ("amd", "nvidia")
           for f in layout.check_layout(model_layout(p, plat)) if f.fails}
    if p["poll"] == 1:
        out |= {"acquire-missing", "poll-no-acquire"}
    if p["poll"] == 2:
        out.add("spin-no-load")  # NVIDIA; clang-19 deletes the side-effect-free loop instead
    return out


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous iff a layout check or a poll check must fire for these parameters."""
    found = predicted_checks(params)
    if not found:
        return StaticVerdict(False, "one line per barrier word; acquire after the poll")
    return StaticVerdict(True, ", ".join(sorted(found)))


def strategy() -> Any:
    """Layout points: slot stride, where the other barrier's counter sits, the poll kind."""
    def point(variant, stride, done_delta, poll):
        counter = RELEASES * stride
        return {"variant": variant, "slot_stride": stride, "done_offset": counter + done_delta,
                "poll": poll}
    return st.builds(point, st.sampled_from([v.name for v in VARIANTS]),
                     st.sampled_from([4, 8, 16, 32, 64, 128]),
                     st.sampled_from([4, 32, 64, 128, 1024]), st.sampled_from(sorted(POLLS)))


def static_check(params: dict[str, Any]):
    """Findings for one point from real compiler output (AMD listing and NVIDIA cubin/PTX).
    A missing NVIDIA disassembler leaves an `info` finding naming what was skipped."""
    from hazards.static import amdgcn, sass
    from hazards.static.compile import compile_ptx
    from hazards.static.findings import Finding
    from stress.errors import ToolchainMissing

    d = defines(params)
    label = POINTS.label("barrier_layout", params)
    amd, stmts = amdgcn.compile_annotated(SOURCE, defines=d, label=label)
    found = amdgcn.check_listing(amd.text, str(amd.path), target="gfx942", stmts=stmts,
                                 source_path=str(SOURCE))
    rows = layout.table_from_amdgcn(amd.text)
    found += layout.check_layout(layout.layout_from_table(rows, "amd"), str(amd.path))
    try:
        ptx = compile_ptx(SOURCE, defines=d, label=label)
        found += layout.check_layout(layout.layout_from_table(layout.table_from_ptx(ptx.text),
                                                              "nvidia"), str(ptx.path))
        found += sass.compile_and_check(SOURCE, defines=d, label=label)
    except ToolchainMissing as e:
        found.append(Finding("toolchain-missing", "info", str(SOURCE), 0,
                             f"NVIDIA checks skipped: {e}"))
    return found


FAMILY = Family(
    name="barrier_layout",
    summary="release flags and arrival counters: write-through + L2 atomic in one line (lost "
            "release), false sharing, polls without acquire, hoisted polls",
    variants=VARIANTS,
    static_model=static_model,
    strategy=strategy,
    source_dir="barrier_layout",
    binary=None,
    platforms=("cuda", "amd"),
    runtime_params={"epochs": "barrier rounds per launch (H200 harness, not yet run)",
                    "words": "data words per producer and epoch"},
)
