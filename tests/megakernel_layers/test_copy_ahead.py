"""Campaign step (l) (MKL_CAMPAIGN_STEP 14, candidate step_l, round 16; production from round 18 until step 15): step 10
(production from round 14 until step 14, candidate step_10) with the
copies on the layer's critical path issuing every load of a thread before its first store
(MKL_COPY_AHEAD: copy_to_shared, rmsnorm_ahead, the router's payload, the O-projection's and W2's
emits in mkl_kernel.cuh).

Read on the CPU (nvcc 13.0, sm_90a) in the build the GPU runs: the harness's flags (stress/build.py
TARGETS, -split-compile=0 among them: ptxas then infers no address space across functions, so an
out-of-line task's pointer arguments are generic) with -lineinfo, nvdisasm -g mapping each instruction
to its source line. Step 10 there waits for each copy load before the next at five sites (a
generic load or store may alias the shared or global store before it): the attention's q copy
`LD.E; STS; LD.E; STS` (8 a thread at the default shape), the RMSNorm's weight pass, the router's hn
payload `LD, LD, ST`, the O-projection's emit (x reloaded after each h store) and W2's emit. In step
(l)'s build no basic block of a site holds a load after one of the site's stores, each site's first
store comes after all of a thread's loads, and no load changes kind (plain, weak, default caching:
LD.E / LDG.E, no .CG, .NC or .STRONG). No function spills more than step 10's in that build, and the
compiled static checks pass with step 10's polls (no wait added or moved). On the branch that added step
(l), step 10 was production and its machine code was untouched (main 829ab29's, 79,188 lines of
cuobjdump -sass); since promote14 production was step 14, from promote15 step 15, from promote21 step 21, since promote22 step 22 (test_production_step22.py). Before step (l)
MKL_CAMPAIGN_STEP 14 built step 10's kernel: the site tests fail there (no step (l) code; step 10's
sites hold the loads behind stores).
"""
from __future__ import annotations

import re
import subprocess

import pytest

from hazards.megakernel_layers import faithful as FA

from .sass_text import function_part, spills_by_function, spills_grown
from .test_merge_spread import ROOT, assert_static_checks_pass_with_the_polls_of, family_cubin
from .test_production_step22 import switches_changed_from_step_10

KERNEL = ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh"
LOAD = re.compile(r"\b(LDG|LD)\.E\S*")               # a global (or generic) load
STORE = re.compile(r"\b(STS|STG|ST)(\.\S+)?\s")       # a shared, global or generic store
BLOCK_END = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(BRA|EXIT|RET\S*|CALL\S*)\b")  # unpredicated: a taken path ends

# Each site: (lines' texts in mkl_kernel.cuh for step (l), for step 10), the functions it is in
# (a name part of nvdisasm's symbol), and the loads a thread has issued before its first store in step (l).
STEP_L_SITES = {
    "q_copy": (("v[k] = s4[min((int)threadIdx.x + k * THREADS, N4 - 1)]",
                "d4[threadIdx.x + k * THREADS] = v[k]"), "attend_chunk", 1),
    "rmsnorm": (("xv[k] = x[i];", "wv[k] = w[i];", "act[threadIdx.x + k * THREADS] = xv[k];",
                 "act[threadIdx.x + k * THREADS] = act[threadIdx.x + k * THREADS] * rs * wv[k];"),
                "rmsnorm_ahead", 12),
    "router_payload": (("hv[k] = h[min(tid + k * THREADS, s.D - 1)];", "nv[k] = mlp_norm[min(tid + k * THREADS",
                        "hn_out[tid + k * THREADS] = hv[k] * rs * nv[k];"), "router_from_partials", 12),
    "oproj_fill_and_hn_fill": (("v[k] = s4[min(b + k * THREADS, n4 - 1)]", "d4[b + k * THREADS] = v[k]"),
                               ("mkl_megakernel", "copy_to_shared_block"), 2),
    "oproj_emit": (("xr[j] = xcur[r + min(j, n - 1)];", "p.h[r + j] = xr[j] + a[j];",
                    "hrows[r + j - r0] = xr[j] + a[j];"), "mkl_megakernel", 4),
    "w2_emit": (("hr[j] = p.h[r + min(j, n - 1)];", "p.xres[r + j] = hr[j] + a[j];"), "mkl_megakernel", 4),
}
STEP_10_SITES = {
    "q_copy": (("q[i] = qbuf[i];",), "attend_chunk"),
    "rmsnorm": (("const float v = x[i];", "act[i] = v;", "act[i] = act[i] * rs * w[i];"), "mkl_megakernel"),
    "router_payload": (("hn_out[i] = h[i] * rs * mlp_norm[i];",), "router_from_partials"),
    "oproj_emit": (("p.h[r + j] = xcur[r + j] + a[j];", "hrows[r + j - r0] = xcur[r + j] + a[j];"), "mkl_megakernel"),
    "w2_emit": (("p.xres[r + j] = p.h[r + j] + a[j];",), "mkl_megakernel"),
}


def _lines(texts: tuple[str, ...]) -> set[int]:
    """mkl_kernel.cuh's line numbers of every line containing one of `texts` (each found at least once)."""
    lines = KERNEL.read_text().splitlines()
    out = set()
    for text in texts:
        found = {n for n, line in enumerate(lines, 1) if text in line}
        assert found, text
        out |= found
    return out


def _harness_build(defines: dict[str, int] | None, label: str):
    return family_cubin(defines, label, "-Xptxas=-v")


def _attributed(cubin) -> list[tuple[str, int | None, str]]:
    """(function, mkl_kernel.cuh line or None, instruction or label) of the cubin's nvdisasm -c -g listing."""
    from hazards.engine.errors import ToolchainMissing
    from hazards.engine.toolchain import find_tool

    try:
        tool = find_tool("nvdisasm", needed_for="to read the build's machine code")
    except ToolchainMissing as e:
        pytest.skip(f"cannot read the build's machine code: {e}")
    text = subprocess.run([str(tool), "-c", "-g", str(cubin.path)], capture_output=True, text=True, check=True).stdout
    out, fn, line = [], "", None
    for raw in text.splitlines():
        if m := re.match(r'\s*//## File "(.*)", line (\d+)', raw):
            line = int(m.group(2)) if m.group(1).endswith("mkl_kernel.cuh") else None
            continue
        if (label := re.match(r"^(\S+):\s*$", raw)) and not raw.startswith(".L"):
            fn = label.group(1).removeprefix(".text.")
            line = None
            continue
        out.append((fn, line, raw))
    return out


def _site(listing, lines: set[int], functions) -> dict[str, list[list[str]]]:
    """{function instance: its straight-line runs' site instructions (loads and stores on `lines`)}:
    each function of the listing whose symbol's function part (every copy's) names one of `functions`; a run ends at
    a label or after an unpredicated branch, call, return or exit (a predicated branch not taken falls
    through: in-order issue goes on, so step 10's `LDG; STG; @!P0 BRA; LDG; ...` is one run)."""
    functions = (functions,) if isinstance(functions, str) else functions
    out: dict[str, list[list[str]]] = {}
    for fn, line, ins in listing:
        if not any(f in function_part(fn) for f in functions):
            continue
        blocks = out.setdefault(fn, [[]])
        if re.match(r"^\.L\w+:", ins.strip()):
            blocks.append([])
            continue
        if line in lines and (LOAD.search(ins) or STORE.search(ins)):
            blocks[-1].append(ins)
        if BLOCK_END.search(ins):
            blocks.append([])
    return out


def _load_after_store(block: list[str]) -> bool:
    stored = False
    for ins in block:
        if STORE.search(ins) and not LOAD.search(ins):
            stored = True
        elif LOAD.search(ins) and stored:
            return True
    return False


def _loads_before_first_store(blocks: list[list[str]]) -> int:
    n = 0
    for ins in (i for b in blocks for i in b):
        if STORE.search(ins) and not LOAD.search(ins):
            return n
        n += 1
    return n


@pytest.fixture(scope="module")
def step_l():
    cubin = _harness_build({"MKL_CAMPAIGN_STEP": 14}, "test-mkl-step-l-harness")
    return cubin, _attributed(cubin)


@pytest.fixture(scope="module")
def step_10():
    cubin = _harness_build({"MKL_CAMPAIGN_STEP": 10}, "test-mkl-step-10-harness")
    return cubin, _attributed(cubin)


def test_step_10_copy_sites_wait_for_each_load_before_the_next_in_the_harness_build(step_10):
    """What step (l) is about: in the build the GPU runs, each of these sites has a basic block with a
    load behind one of its stores (one dependent round trip a store)."""
    _, listing = step_10
    for name, (texts, functions) in STEP_10_SITES.items():
        found = _site(listing, _lines(texts), functions)
        assert found, name
        assert any(_load_after_store(b) for blocks in found.values() for b in blocks), name
    # the q copy's loads are generic there (-split-compile=0: no address space inferred across calls)
    q = _site(listing, _lines(STEP_10_SITES["q_copy"][0]), "attend_chunk")
    assert all(re.search(r"\bLD\.E\b", i) for blocks in q.values() for b in blocks for i in b if LOAD.search(i))


def test_step_l_issues_each_sites_loads_before_its_first_store(step_l):
    _, listing = step_l
    for name, (texts, functions, ahead) in STEP_L_SITES.items():
        found = _site(listing, _lines(texts), functions)
        fns = (functions,) if isinstance(functions, str) else functions
        # in both kernels (tripwire in and out) and, for attend_chunk, both shapes
        assert len(found) >= 2 * len(fns), (name, sorted(found))
        for fn, blocks in found.items():
            assert not any(_load_after_store(b) for b in blocks), (name, fn)
            assert _loads_before_first_store(blocks) >= ahead, (name, fn, blocks)
    # the default shape's q copy: a thread's two float4s, both loaded before the first store
    q = _site(listing, _lines(STEP_L_SITES["q_copy"][0]), "attend_chunkILi8ELi8")
    assert q and all(_loads_before_first_store(b) == 2 for b in q.values()), q


def test_step_l_keeps_each_loads_kind(step_l, step_10):
    """Plain, weak, default-cached loads stay that (LD.E / LDG.E, widened to .64/.128 at most): nothing
    becomes ld.cg, ld.nc (.CONSTANT) or a strong load, which would change what an acquire shows them."""
    for listing, sites in ((step_l[1], STEP_L_SITES), (step_10[1], STEP_10_SITES)):
        for name, spec in sites.items():
            found = _site(listing, _lines(spec[0]), spec[1])
            loads = [i for blocks in found.values() for b in blocks for i in b if LOAD.search(i)]
            assert loads, name
            for ins in loads:
                assert re.search(r"\bLDG?\.E(\.64|\.128)?\s", ins), (name, ins)


@pytest.fixture(scope="module")
def spill_builds():
    """Steps 10 and (l) in the harness build from canonical_sources (family_cubin's `canonical`): their spills
    the same for any comment or layout of the same code and in any checkout (staged_sources' folder is named
    by the content, and its name re-rolls NVVM's cloning: see canonical_sources)."""
    return (family_cubin({"MKL_CAMPAIGN_STEP": 10}, "test-mkl-step-10-canon-v", "-Xptxas=-v", canonical=True),
            family_cubin({"MKL_CAMPAIGN_STEP": 14}, "test-mkl-step-l-canon-v", "-Xptxas=-v", canonical=True))


def test_step_l_spills_no_more_than_step_10_anywhere_in_the_harness_build(spill_builds):
    """Per function at its worst copy (spills_by_function), both builds from canonical_sources."""
    prod, step = spills_by_function(spill_builds[0].log), spills_by_function(spill_builds[1].log)
    assert any("mkl_megakernel" in k for k in prod), sorted(prod)
    assert set(prod) <= set(step), sorted(set(prod) - set(step))
    worse = spills_grown(prod, step)
    assert not worse, worse
    # its two out-of-line helpers spill nothing
    new = {k: v for k, v in step.items() if k not in prod}
    assert any("rmsnorm_ahead" in k for k in new) and any("copy_to_shared_block" in k for k in new), sorted(new)
    assert all(v == (0, 0) for v in new.values()), new


def test_step_l_passes_the_compiled_static_checks_with_step_10_polls():
    assert_static_checks_pass_with_the_polls_of(14, 10)


def test_step_l_is_step_10_but_for_the_copies_and_step_14_code():
    c = FA.candidate("step_l")
    assert dict(c.defines) == {"MKL_CAMPAIGN_STEP": 14} and c.params == ()
    assert c.expected == "slower" and "step_14's" in c.what  # production from round 18 until step 15
    changed, base, step = switches_changed_from_step_10({"MKL_CAMPAIGN_STEP": 14})
    assert changed == {"MKL_CAMPAIGN_STEP", "MKL_COPY_AHEAD"}
    assert step["MKL_COPY_AHEAD"] == 1 and step["MKL_W2_QUANT_AHEAD"] == 1 and base["MKL_COPY_AHEAD"] == 0
