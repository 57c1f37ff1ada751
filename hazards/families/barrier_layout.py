"""Family `barrier_layout`: where the words of a release-flag + arrival-counter barrier live.

The MoE barrier report (in the MI355 megakernel PR): eight write-through release flags at
[0..7] and the L2 atomic arrival counter at [8] of one 64-B line; an L2 write-back reverted
releases that had fired and the waiters hung. Kernel:
`standalone/barrier_layout/barrier_layout.cu` (HIP-portable), in two builds of one source.

Static oracles, on real compiler output of the *point build* (-D parameters, the report's
unbounded spins): the layout table read back from clang-19's gfx942 listing (64-B lines)
and from nvcc's PTX (128-B lines, 32-B sectors) goes through `hazards.static.layout`; the
gfx942 listing through the AMDGCN release/acquire checks; the sm_90a cubin (nvdisasm)
through the SASS poll checks.

Runtime oracle, the *runtime build* (`binary`, served by the harness): every parameter is
a request field, every spin is bounded by `spin_timeout_us` (a lost release is a counted
`spin_timeouts` and a mismatched launch, never a hang), every data word and the barrier's
final state are checked on the device per launch, and `ns_per_barrier` is measured on the
device. On NVIDIA the L2 is the point of coherence, so the report's lost release has no
mechanism there: the static layout check stays the oracle for the AMD hazard, and the H200
measures the cost of sharing a line (bench/barrier_layout_cost.py).
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hazards.family import STANDALONE, Family, StaticVerdict, Variant
from hazards.presets import Points
from hazards.static import checks, layout

SOURCE = STANDALONE / "barrier_layout" / "barrier_layout.cu"
RELEASES = 8
# The layout/poll/release point: -D parameters of the point build, request fields of the
# runtime build (same names and defaults as barrier_layout_host.h's ParamSpec list).
DEFAULTS: dict[str, Any] = {"slot_stride": 128, "done_offset": 16 * 128, "poll": 0, "release": 0}
DEFINE_NAMES = {"slot_stride": "HZ_SLOT_STRIDE", "done_offset": "HZ_DONE_OFFSET", "poll": "HZ_POLL",
                "release": "HZ_RELEASE"}
POLLS = {0: "acquire load", 1: "volatile load, no acquire", 2: "plain load (hoistable)"}
RELEASE_KINDS = {0: "write-through store (st.global.wt; AMD sc0 sc1)", 1: "release store (st.release.gpu)",
                 2: "L2 atomic exchange (atom.release.gpu.exch)"}
RELEASE_ACCESS = {0: 1, 1: 2, 2: 0}  # release kind -> layout access code (1 write-through, 2 plain, 0 atomic)
# Request fields of the runtime build only.
RUNTIME_DEFAULTS: dict[str, Any] = {"epochs": 64, "words": 256, "blocks": 0, "producers": 0, "jitter": 0,
                                    "spin_timeout_us": 20000, "drop_release": 0}
RUNTIME_PARAMS = {
    "slot_stride": "bytes between release flags; the arrival counter sits at 8 x stride "
                   "(4: one line, the MoE barrier report's layout)",
    "done_offset": "byte offset of the consumers' done counter (1028: next to the arrival counter)",
    "poll": "0 ld.acquire.gpu, 1 volatile load without acquire, 2 plain load (hoisted: a timeout)",
    "release": "0 st.global.wt (the MoE barrier report's write-through), 1 st.release.gpu, "
               "2 atom.release.gpu.exch",
    "epochs": "barrier rounds per launch",
    "words": "data words per producer and epoch (every consumer checks all of them)",
    "blocks": "grid size (0: one per SM); all blocks must be co-resident",
    "producers": "producer blocks (0: an eighth of the grid)",
    "jitter": "random delay before each arrival, up to jitter*128 clocks",
    "spin_timeout_us": "a spin gives up after this long: spin_timeouts + a mismatched launch",
    "drop_release": "emulated lost release: flag 0 is not written at this epoch (0: never)",
}

VARIANTS = (
    Variant("fixed", "fixed", "every barrier word on its own 128-B line, acquire poll", params={}),
    Variant("broken_shared_line", "broken", "the MoE barrier report's layout: releases [0..7] "
            "and the counter [8] "
            "in one line (4-B stride)", params={"slot_stride": 4}, detected_by=("static",)),
    Variant("broken_false_sharing", "broken", "the consumers' done counter next to the "
            "producers' arrival counter", params={"done_offset": RELEASES * 128 + 4},
            detected_by=("static",)),
    Variant("broken_no_acquire", "broken", "consumers poll a volatile flag, then read data "
            "with no acquire", params={"poll": 1}, detected_by=("static", "stress")),
    Variant("broken_hoisted_poll", "broken", "consumers poll a plain flag: nvcc hoists the load "
            "(certain hang; the runtime build's bounded spin times out); clang drops the empty "
            "loop (no wait at all)", params={"poll": 2, "spin_timeout_us": 2000},
            detected_by=("static", "stress")),
    Variant("fixed_release_store", "fixed", "separate lines, releases by st.release.gpu",
            params={"release": 1}),
    Variant("fixed_atomic_release", "fixed", "separate lines, releases by an L2 atomic exchange",
            params={"release": 2}),
    Variant("shared_line_atomic", "fixed",
            "the MoE barrier report's layout, but every word of the line an L2 atomic",
            params={"slot_stride": 4, "release": 2}),
)
_BY_NAME = {v.name: v for v in VARIANTS}
POINTS = Points(DEFAULTS, VARIANTS, DEFINE_NAMES)
resolve = POINTS.resolve
defines = POINTS.defines


def model_layout(params: dict[str, Any], platform: str) -> layout.Layout:
    """The layout the kernel should build for these parameters (the model side)."""
    p = resolve(params)
    access = RELEASE_ACCESS[int(p["release"])]
    rows = [(x * p["slot_stride"], 4, access, 0) for x in range(RELEASES)]
    rows += [(RELEASES * p["slot_stride"], 4, 0, 0), (p["done_offset"], 4, 0, 1)]
    return layout.layout_from_table(rows, platform)


def predicted_checks(params: dict[str, Any]) -> set[str]:
    """The failing check ids this point must trigger (empty = clean)."""
    p = resolve(params)
    out = {f.check for plat in ("amd", "nvidia")
           for f in layout.check_layout(model_layout(p, plat)) if f.fails}
    if p["poll"] == 1:
        out |= {checks.ACQUIRE_MISSING.id, checks.POLL_NO_ACQUIRE.id}
    if p["poll"] == 2:
        out.add(checks.SPIN_NO_LOAD.id)  # NVIDIA; clang-19 deletes the side-effect-free loop instead
    return out


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous iff a layout check or a poll check must fire for these parameters, or the
    runtime request emulates a lost release (`drop_release`)."""
    found = predicted_checks(params)
    if resolve(params).get("drop_release"):
        found.add("emulated lost release (drop_release)")
    if not found:
        return StaticVerdict(False, "no write-through word in a line with an L2 writer, no line "
                                    "shared by unrelated barriers; acquire after the poll")
    return StaticVerdict(True, ", ".join(sorted(found)))


def strategy() -> Any:
    """Layout points: slot stride, where the other barrier's counter sits, the poll kind, the
    release kind."""
    def point(variant, stride, done_delta, poll, release):
        counter = RELEASES * stride
        return {"variant": variant, "slot_stride": stride, "done_offset": counter + done_delta,
                "poll": poll, "release": release}
    return st.builds(point, st.sampled_from([v.name for v in VARIANTS]),
                     st.sampled_from([4, 8, 16, 32, 64, 128]),
                     st.sampled_from([4, 32, 64, 128, 1024]), st.sampled_from(sorted(POLLS)),
                     st.sampled_from(sorted(RELEASE_KINDS)))


def static_check(params: dict[str, Any]):
    """Findings for one point from real compiler output (AMD listing and NVIDIA cubin/PTX).
    A missing NVIDIA disassembler leaves an `info` finding naming what was skipped."""
    from hazards.static import amdgcn, sass
    from hazards.static.compile import compile_ptx
    from hazards.engine.errors import ToolchainMissing

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
        found.append(checks.TOOLCHAIN_MISSING.finding(str(SOURCE), 0,
                                                      f"NVIDIA checks skipped: {e}"))
    return found


FAMILY = Family(
    name="barrier_layout",
    summary="release flags and arrival counters: write-through + L2 atomic in one line (lost "
            "release, AMD), false sharing, polls without acquire, hoisted polls; release by "
            "st.wt / st.release / atomic; bounded spins at run time",
    variants=VARIANTS,
    static_model=static_model,
    strategy=strategy,
    source_dir="barrier_layout",
    binary="barrier_layout",
    platforms=("cuda", "amd"),
    default_launches=200,
    timeout_s=20.0,
    runtime_params=RUNTIME_PARAMS,
)
