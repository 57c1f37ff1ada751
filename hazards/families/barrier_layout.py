"""Family `barrier_layout`: where the words of a release-flag + arrival-counter barrier live.

The MoE barrier report (in the MI355 megakernel PR): eight write-through release flags at
[0..7] and the L2 atomic arrival counter at [8] of one 64-B line; an L2 write-back reverted
releases that had fired and the waiters hung. Kernel:
`standalone/barrier_layout/barrier_layout.cu` (HIP-portable), in two builds of one source.
More in docs/families/barrier_layout.md.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hazards.engine import toolchain
from hazards.family import StaticVerdict, load_family
from hazards.kernel_sources import family_dir
from hazards.static import checks, layout

SOURCE = family_dir("barrier_layout") / "barrier_layout.cu"
# The catalog judges every variant on each AMD target's listing; the NVIDIA half (PTX layout,
# SASS polls) does not depend on the AMD target and runs once, with the first.
STATIC_ARCHS = toolchain.AMD_ARCHS
RELEASES = 8
POLLS = {0: "acquire load", 1: "volatile load, no acquire", 2: "plain load (hoistable)"}
RELEASE_KINDS = {0: "write-through store (st.global.wt; AMD sc0 sc1)", 1: "release store (st.release.gpu)",
                 2: "L2 atomic exchange (atom.release.gpu.exch)"}
RELEASE_ACCESS = {0: 1, 1: 2, 2: 0}  # release kind -> layout access code (1 write-through, 2 plain, 0 atomic)


def model_layout(params: dict[str, Any], platform: str) -> layout.Layout:
    """The layout the kernel should build for these parameters (the model side)."""
    p = FAMILY.resolve(params)
    access = RELEASE_ACCESS[int(p["release"])]
    rows = [(x * p["slot_stride"], 4, access, 0) for x in range(RELEASES)]
    rows += [(RELEASES * p["slot_stride"], 4, 0, 0), (p["done_offset"], 4, 0, 1)]
    return layout.layout_from_table(rows, platform)


def predicted_checks(params: dict[str, Any], arch: str = toolchain.GFX942) -> set[str]:
    """The failing check ids this point must trigger (empty = clean): the AMD ones on
    `arch`'s listing, and with the first AMD target the NVIDIA ones."""
    p = FAMILY.resolve(params)
    nvidia = arch == STATIC_ARCHS[0]
    out = {f.check for plat in ("amd", "nvidia") if plat == "amd" or nvidia
           for f in layout.check_layout(model_layout(p, plat)) if f.fails}
    if p["poll"] == 1:
        out |= {checks.ACQUIRE_MISSING.id, *([checks.POLL_NO_ACQUIRE.id] if nvidia else [])}
    if p["poll"] == 2 and nvidia:
        out.add(checks.SPIN_NO_LOAD.id)  # NVIDIA; clang deletes the side-effect-free loop instead
    return out


def runtime_rate(params: dict[str, Any]) -> float:
    """The per-launch failure rate of the runtime build on the H200 (NVIDIA), as measured in
    docs/results/barrier-layout-h200.md: a poll without acquire reads stale words from the
    second round on, a hoisted poll times out, a dropped release times out, in every launch;
    the layout findings are AMD's (the L2 is NVIDIA's point of coherence: 0 of 10,000)."""
    p = FAMILY.resolve(params)
    epochs = int(p["epochs"])
    if p["poll"] == 1 and epochs >= 2:
        return 1.0
    if p["poll"] == 2:
        return 1.0
    if 0 < p["drop_release"] <= epochs:
        return 1.0
    return 0.0


def static_model(params: dict[str, Any]) -> StaticVerdict:
    """Hazardous iff a layout check or a poll check must fire for these parameters, or the
    runtime request emulates a lost release (`drop_release`); the rate is the runtime
    build's on the H200 (`runtime_rate`)."""
    found = predicted_checks(params)
    if FAMILY.resolve(params)["drop_release"]:
        found.add("emulated lost release (drop_release)")
    if not found:
        return StaticVerdict(False, "no write-through word in a line with an L2 writer, no line "
                                    "shared by unrelated barriers; acquire after the poll", 0.0)
    return StaticVerdict(True, ", ".join(sorted(found)), runtime_rate(params))


def strategy() -> Any:
    """Layout points: slot stride, where the other barrier's counter sits, the poll kind, the
    release kind."""
    def point(variant, stride, done_delta, poll, release):
        counter = RELEASES * stride
        return {"variant": variant, "slot_stride": stride, "done_offset": counter + done_delta,
                "poll": poll, "release": release}
    return st.builds(point, st.sampled_from([v.name for v in FAMILY.variants]),
                     st.sampled_from([4, 8, 16, 32, 64, 128]),
                     st.sampled_from([4, 32, 64, 128, 1024]), st.sampled_from(sorted(POLLS)),
                     st.sampled_from(sorted(RELEASE_KINDS)))


def static_check(params: dict[str, Any], arch: str = toolchain.GFX942):
    """Findings for one point from real compiler output (the AMD listing for `arch`; with the
    first AMD target also the NVIDIA cubin/PTX). A missing NVIDIA toolchain leaves a
    `toolchain-missing` finding naming what could not run."""
    from hazards.static import amdgcn, sass
    from hazards.static.compile import compile_ptx
    from hazards.engine.errors import ToolchainMissing

    d = FAMILY.defines(params)
    label = FAMILY.build_label(params)
    amd, stmts = amdgcn.compile_annotated(SOURCE, arch=arch, defines=d, label=f"{label}-{arch}")
    found = amdgcn.check_listing(amd.text, str(amd.path), target=arch, stmts=stmts,
                                 source_path=str(SOURCE))
    rows = layout.table_from_amdgcn(amd.text)
    found += layout.check_layout(layout.layout_from_table(rows, "amd"), str(amd.path))
    if arch != STATIC_ARCHS[0]:
        return found
    try:
        ptx = compile_ptx(SOURCE, defines=d, label=label)
        found += layout.check_layout(layout.layout_from_table(layout.table_from_ptx(ptx.text),
                                                              "nvidia"), str(ptx.path))
        found += sass.compile_and_check(SOURCE, defines=d, label=label)
    except ToolchainMissing as e:
        found.append(checks.could_not_look(str(SOURCE), "NVIDIA checks", e))
    return found


# Parameters (the -D ones and the run-time ones), variants and their reasons:
# standalone/barrier_layout/family.toml.
FAMILY = load_family("barrier_layout", static_model=static_model, strategy=strategy,
                     static_check=static_check, predicted_checks=predicted_checks, static_archs=STATIC_ARCHS)
