"""Production is campaign step 22 (promote22; the seventeenth session's two gates, production (step 21) -> step_t,
an H100, both called the plain launch faster and the profiled worker not slower): step 21 + step (t)'s split
merge (MKL_MERGE_SPLIT), candidate step_t's code (step 21 with -DMKL_MERGE_SPLIT=1).
Step 21 (MKL_CAMPAIGN_STEP 21, candidate step_21: production from promote21 until step 22; round 24's confirming
gate, production (step 15) -> step_p_r, called the plain launch faster and the profiled worker not slower) is
step 15 + step (p)'s router switch + step (r)'s W13 acq_rel fences, candidate step_p_r's code (step 20 with
-DMKL_ROUTER_WIDE=1).
Step 15 (MKL_CAMPAIGN_STEP 15, candidate step_15: production from round 20 until step 21, promote15; step 18 held
production for one confirming gate in round 23, promote18, and was undone) is step 14 + step (m), candidate
step_m's code.
Step 14 (MKL_CAMPAIGN_STEP 14, candidate step_14: production from round 18 until step 15, promote14)
is step 10 + step (l), candidate step_l's code. Step 10 (MKL_CAMPAIGN_STEP 10, candidate step_10:
production from round 14 until step 14, promote10) is step (e) + step (g), candidate step_g_on_e's
code (MKL_CAMPAIGN_STEP 8 with MKL_ATTN_AHEAD 0), without step (f) and step (h).

On the CPU: production's campaign switches are step 21's plus MKL_MERGE_SPLIT and nothing else, step 21's are
step 15's plus MKL_ROUTER_WIDE and MKL_W13_ACQ_REL (step 15's are step 14's plus MKL_ATTN_MMA, step 14's step
10's plus MKL_COPY_AHEAD), and every preprocessor condition of the family's sources reads the default build as
step 21 with step (t)'s switch on and step 21 as step 15 with steps (p)'s and (r)'s switches on (a raw
`MKL_CAMPAIGN_STEP >= N` / `== N` must give 22 and 21 step 15's value; 15 reads as step 14 with step (m)'s switch
on, 14 as step 10 with step (l)'s); steps 17-20 (steps (o), (p), (q), (r)) stay step 15 with their own switch
alone, step 21 has no split merge; mkl_model.h's merge heads follow the same default (the C header and the
Python model); the default build's code is step_t's: its normalised PTX and its machine code (cuobjdump -sass,
nvcc 13.0, sm_90a) line for line, and not step 21's (step_p_r's, whose normalised PTX step 21's build is) or
step 15's; its code (the harness
build's PTX, its path-hashed names and line info read alike in every checkout) is the one pinned in
production_ptx.json (the compiler's release, line count and sha256); a change that changes it updates the pin
on purpose (UPDATE_COMMAND). The step-10 build keeps promote10's facts: every switch and condition takes
step_g_on_e's value (step (e)'s but for step (g)'s switch), and its machine code is step_g_on_e's line for
line. The catalog names the previous productions (step_21, step_15, step_14 and step_10, expected
slower than production), step_t as production's code (no-change) and step_p_r as step 21's; the GPU suite's
prebuilt builds hold every build test_gpu.py compares. With the default left at 21 (main before promote22), the
tests of production's switches, conditions, code and catalog entry fail.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hazards.megakernel_layers import faithful as FA

from .test_merge_spread import (INCLUDE, LAYERED, ROOT, assert_static_checks_pass_with_the_polls_of, copy_sources,
                                family_cubin)

KERNEL = ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh"
SWITCHES = ("MKL_CAMPAIGN_STEP", "MKL_ROUTER_FOLDED", "MKL_WEIGHT_RING", "MKL_MERGE_SPREAD", "MKL_ROUTER_LATENCY",
            "MKL_ATTN_AHEAD", "MKL_W2_QUANT_AHEAD", "MKL_HEAD_AHEAD", "MKL_GEMV_ONE_ROUND", "MKL_QKV_SPREAD", "MKL_L2_KEEP_QKV",
            "MKL_COPY_AHEAD", "MKL_ATTN_MMA", "MKL_W13_EMIT_LEAN", "MKL_ROUTER_WIDE", "MKL_CHUNK_LEAN",
            "MKL_W13_ACQ_REL", "MKL_HN_FIRST", "MKL_MERGE_SPLIT", "MKL_RESERVE_RING_SMEM", "MKL_OPROJ_STAGE",
            "MKL_ATTN_STAGE")
STEP_G_ON_E = dict(FA.candidate("step_g_on_e").defines)
STEP_10 = {"MKL_CAMPAIGN_STEP": 10}
STEP_14 = {"MKL_CAMPAIGN_STEP": 14}
STEP_15 = {"MKL_CAMPAIGN_STEP": 15}
STEP_21 = {"MKL_CAMPAIGN_STEP": 21}
STEP_P_R = dict(FA.candidate("step_p_r").defines)  # step 20 + -DMKL_ROUTER_WIDE=1: step 21's code
STEP_T = dict(FA.candidate("step_t").defines)  # step 21 + -DMKL_MERGE_SPLIT=1: production's code
PRODUCTION_STEP = 22  # mkl_kernel.cuh's default MKL_CAMPAIGN_STEP since promote22
STEP_21_SWITCHES = ("MKL_ROUTER_WIDE", "MKL_W13_ACQ_REL")  # steps (p) and (r): what step 21 adds to step 15
PRODUCTION_SWITCHES = ("MKL_MERGE_SPLIT",)  # step (t): what production (step 22) adds to step 21


def _eval(expr: str, env: dict[str, int]) -> int:
    """A preprocessor expression over the campaign switches (an undefined name is 0, as in C)."""
    expr = re.sub(r"//.*", "", expr).replace("||", " or ").replace("&&", " and ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    expr = re.sub(r"\bMKL_\w+\b", lambda m: str(env.get(m.group(0), 0)), expr)
    return int(eval(expr, {"__builtins__": {}}, {}))  # noqa: S307 (digits, comparisons, and/or/not)


def _switches(defines: dict[str, int]) -> dict[str, int]:
    """The campaign switches as mkl_kernel.cuh defines them from `defines` (-D on the command line)."""
    text = KERNEL.read_text()
    block = text[text.index("#ifndef MKL_CAMPAIGN_STEP"):text.index("namespace mkl {")]
    env, skipping = dict(defines), []
    for line in block.splitlines():
        if m := re.match(r"#ifndef (\w+)", line):
            skipping.append(m.group(1) in env)
        elif line.startswith("#endif"):
            skipping.pop()
        elif (m := re.match(r"#define (MKL_\w+) (.*)", line)) and not any(skipping):
            env[m.group(1)] = _eval(m.group(2), env)
    assert set(SWITCHES) <= set(env), sorted(env)
    return {k: env[k] for k in SWITCHES}


def switches_changed_from_step(base_step: int, defines: dict[str, int]) -> tuple[set[str], dict[str, int], dict[str, int]]:
    """(the switches the build of `defines` sets otherwise than step `base_step`, that step's, the build's)."""
    base, step = _switches({"MKL_CAMPAIGN_STEP": base_step}), _switches(defines)
    return {k for k in base if base[k] != step[k]}, base, step


def switches_changed_from_step_10(defines: dict[str, int]) -> tuple[set[str], dict[str, int], dict[str, int]]:
    """(the switches the build of `defines` sets otherwise than step 10, step 10's, the build's): steps
    (i)-(l)'s base."""
    return switches_changed_from_step(10, defines)


def switches_changed_from_step_14(defines: dict[str, int]) -> tuple[set[str], dict[str, int], dict[str, int]]:
    """(the switches the build of `defines` sets otherwise than step 14, step 14's, the build's): step
    (m)'s base."""
    return switches_changed_from_step(14, defines)


def switches_changed_from_step_15(defines: dict[str, int]) -> tuple[set[str], dict[str, int], dict[str, int]]:
    """(the switches the build of `defines` sets otherwise than step 15, step 15's, the build's): steps
    (o)-(r)'s base, and production's."""
    return switches_changed_from_step(15, defines)


def _conditions(env: dict[str, int]) -> dict[str, int]:
    """{file:line: value} of every #if / #elif of the family's sources and probes over the switches alone."""
    out = {}
    files = [*sorted((ROOT / "standalone" / "megakernel_layers").glob("*.cu*")),
             *sorted((ROOT / "standalone" / "megakernel_layers").glob("*.h")),
             *sorted((ROOT / "tests" / "megakernel_layers").glob("*.cu"))]
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            m = re.match(r"\s*#\s*(?:if|elif)\s+(.*)", line)
            if not m:
                continue
            names = set(re.findall(r"\b[A-Za-z_]\w*\b", re.sub(r"//.*", "", m.group(1))))
            if names and names <= set(SWITCHES):
                out[f"{f.name}:{n}"] = _eval(m.group(1), env)
    return out


def assert_step_is_step_15_with_its_switch_alone(step: int, switch: str) -> None:
    """Campaign step `step` sets every switch as step 15 (production from round 20 until step 21, the base
    of the twelfth and thirteenth sessions' candidates, steps (o), (p), (q), (r)) does but `switch` (on) and
    the step number; of steps 0-22 only that step turns `switch` on, and steps 21 and 22 (production) if it
    is step (p)'s or step (r)'s; step 15 leaves it off; -D sets it either way beside any step."""
    changed, base, got = switches_changed_from_step_15({"MKL_CAMPAIGN_STEP": step})
    assert changed == {"MKL_CAMPAIGN_STEP", switch}, changed
    assert got[switch] == 1 and base[switch] == 0
    in_production = switch in STEP_21_SWITCHES
    assert _switches({})[switch] == in_production, (step, switch, _switches({})[switch])
    assert _switches(STEP_21)[switch] == in_production, (step, switch)
    assert [n for n in range(PRODUCTION_STEP + 1) if _switches({"MKL_CAMPAIGN_STEP": n})[switch]] == \
        [step, *([21, PRODUCTION_STEP] if in_production else [])]
    assert _switches({"MKL_CAMPAIGN_STEP": 15, switch: 1})[switch] == 1
    assert _switches({"MKL_CAMPAIGN_STEP": step, switch: 0})[switch] == 0


def assert_every_condition_reads_step_as(step: int, base: int, *switches: str) -> None:
    """Every preprocessor condition of the family reads campaign step `step` as step `base`'s switches with
    `switches` on (a raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give the step what it gives `base`, step
    number included), and for each switch some condition reads it (the step's code differs from the base's
    by each one)."""
    assert switches
    got = _conditions(_switches({"MKL_CAMPAIGN_STEP": step}))
    with_switches = _conditions({**_switches({"MKL_CAMPAIGN_STEP": base}), **dict.fromkeys(switches, 1)})
    assert len(got) >= 30, len(got)  # the kernel's campaign #ifs were found
    assert got == with_switches, {k: (got[k], with_switches[k]) for k in got if got[k] != with_switches[k]}
    before = _conditions(_switches({"MKL_CAMPAIGN_STEP": base}))
    for switch in switches:
        alone = _conditions({**_switches({"MKL_CAMPAIGN_STEP": base}), switch: 1})
        assert {k for k in alone if alone[k] != before[k]}, f"no condition reads {switch}"


def assert_every_condition_reads_step_as_step_15_with(step: int, switch: str) -> None:
    """Step `step` is read as step 15 (the base of steps (o)-(r)) with `switch` on."""
    assert_every_condition_reads_step_as(step, 15, switch)


def test_step_10_takes_step_g_on_e_switches_and_step_e_but_for_step_g():
    step10, g_on_e, step_e = _switches(STEP_10), _switches(STEP_G_ON_E), _switches({"MKL_CAMPAIGN_STEP": 6})
    assert {k: v for k, v in step10.items() if k != "MKL_CAMPAIGN_STEP"} == \
        {k: v for k, v in g_on_e.items() if k != "MKL_CAMPAIGN_STEP"}
    assert {k for k in SWITCHES if step10[k] != step_e[k]} == {"MKL_CAMPAIGN_STEP", "MKL_W2_QUANT_AHEAD"}
    assert step10["MKL_W2_QUANT_AHEAD"] == 1 and step10["MKL_ATTN_AHEAD"] == 0 and step10["MKL_HEAD_AHEAD"] == 0
    assert step10["MKL_ROUTER_LATENCY"] == step10["MKL_ROUTER_FOLDED"] == step10["MKL_MERGE_SPREAD"] == 1
    # the productions before it and the candidates keep their switches
    assert _switches({"MKL_CAMPAIGN_STEP": 5})["MKL_W2_QUANT_AHEAD"] == 0
    assert _switches({"MKL_CAMPAIGN_STEP": 8})["MKL_ATTN_AHEAD"] == 1
    assert _switches({"MKL_CAMPAIGN_STEP": 9})["MKL_W2_QUANT_AHEAD"] == 0


def test_step_14_takes_step_10_switches_and_step_l_alone():
    step14, step10 = _switches(STEP_14), _switches(STEP_10)
    assert {k for k in SWITCHES if step14[k] != step10[k]} == {"MKL_CAMPAIGN_STEP", "MKL_COPY_AHEAD"}
    assert step14["MKL_COPY_AHEAD"] == 1 and step10["MKL_COPY_AHEAD"] == 0 and step14["MKL_ATTN_MMA"] == 0


def test_step_15_takes_step_14_switches_and_step_m_alone():
    step15 = _switches(STEP_15)
    changed, _, _ = switches_changed_from_step_14(STEP_15)
    assert changed == {"MKL_CAMPAIGN_STEP", "MKL_ATTN_MMA"}, changed
    assert step15["MKL_ATTN_MMA"] == 1 and step15["MKL_COPY_AHEAD"] == 1 and step15["MKL_W2_QUANT_AHEAD"] == 1
    # steps (i), (j) and (k) stay off in step 15, and so does step (p)'s router
    assert step15["MKL_GEMV_ONE_ROUND"] == step15["MKL_QKV_SPREAD"] == step15["MKL_L2_KEEP_QKV"] == 0
    assert step15["MKL_ROUTER_WIDE"] == 0


def test_step_21_takes_step_15_switches_and_steps_p_and_r_alone():
    step21 = _switches(STEP_21)
    changed, _, _ = switches_changed_from_step_15(STEP_21)
    assert changed == {"MKL_CAMPAIGN_STEP", *STEP_21_SWITCHES}, changed
    assert step21["MKL_ROUTER_WIDE"] == step21["MKL_W13_ACQ_REL"] == 1 and step21["MKL_MERGE_SPLIT"] == 0
    # step_p_r's build (step 20 with step (p)'s switch by -D) sets every switch as step 21 but the step number
    p_r = _switches(STEP_P_R)
    assert {k for k in SWITCHES if p_r[k] != step21[k]} == {"MKL_CAMPAIGN_STEP"}, p_r


def test_production_takes_step_21_switches_and_step_t_alone():
    from hazards.megakernel_layers import model as M

    prod = _switches({})
    assert prod["MKL_CAMPAIGN_STEP"] == PRODUCTION_STEP == 22 and _switches({"MKL_CAMPAIGN_STEP": 22}) == prod
    assert M.DEFAULT_CAMPAIGN_STEP == 22  # the schedule model reads a build without -D as production
    changed, _, _ = switches_changed_from_step(21, {})
    assert changed == {"MKL_CAMPAIGN_STEP", *PRODUCTION_SWITCHES}, changed
    assert prod["MKL_MERGE_SPLIT"] == 1 and prod["MKL_MERGE_SPREAD"] == 1  # step (t) splits step (d)'s merge
    assert prod["MKL_ROUTER_WIDE"] == prod["MKL_W13_ACQ_REL"] == 1
    assert prod["MKL_ATTN_MMA"] == prod["MKL_COPY_AHEAD"] == prod["MKL_W2_QUANT_AHEAD"] == 1
    # step_t's build (step 21 with step (t)'s switch by -D) sets every switch as production but the step number
    t = _switches(STEP_T)
    assert STEP_T == {"MKL_CAMPAIGN_STEP": 21, "MKL_MERGE_SPLIT": 1}
    assert {k for k in SWITCHES if t[k] != prod[k]} == {"MKL_CAMPAIGN_STEP"}, t
    # -D turns step (t) off beside production's step (step 21's switches) and on beside any step
    assert {k for k in SWITCHES if _switches({"MKL_MERGE_SPLIT": 0})[k] != _switches(STEP_21)[k]} == {"MKL_CAMPAIGN_STEP"}
    assert [n for n in range(PRODUCTION_STEP + 1) if _switches({"MKL_CAMPAIGN_STEP": n})["MKL_MERGE_SPLIT"]] == [22]
    # the other candidates on step 15 stay off in production, and steps (i), (j), (k), (s)
    assert prod["MKL_W13_EMIT_LEAN"] == prod["MKL_CHUNK_LEAN"] == prod["MKL_HN_FIRST"] == 0
    assert prod["MKL_GEMV_ONE_ROUND"] == prod["MKL_QKV_SPREAD"] == prod["MKL_L2_KEEP_QKV"] == 0


@pytest.mark.parametrize("defines, heads", [({}, 1), ({"MKL_CAMPAIGN_STEP": 22}, 1), (STEP_21, 16),
                                            ({"MKL_CAMPAIGN_STEP": 15}, 16), ({"MKL_MERGE_SPLIT": 0}, 16),
                                            ({"MKL_CAMPAIGN_STEP": 21, "MKL_MERGE_SPLIT": 1}, 1)])
def test_the_c_header_and_the_model_read_production_merge_heads_as_step_ts(defines, heads, tmp_path):
    """mkl_model.h is read before mkl_kernel.cuh's switch block: it spells MKL_MERGE_SPLIT's default itself (step 22
    on, or -D); the host compiler's MERGE_HEADS_PER_WORKER and the Python model's merge_heads_per_worker agree
    build by build (production: one head a block, step 21: one a warp)."""
    from hazards.kernel_sources import family_dir
    from hazards.megakernel_layers import model as M

    assert M.merge_heads_per_worker(defines or None) == heads
    cxx = shutil.which("g++") or shutil.which("clang++") or shutil.which("clang++-19")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = tmp_path / "heads.cpp"
    src.write_text('#include <cstdio>\n#include "mkl_model.h"\nint main() { std::printf("%d\\n", mkl::MERGE_HEADS_PER_WORKER); }\n')
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    subprocess.run([cxx, "-std=c++17", *flags, f"-I{family_dir('megakernel_layers')}", str(src), "-o", str(tmp_path / "h")],
                   check=True, capture_output=True, text=True)
    assert int(subprocess.run([str(tmp_path / "h")], check=True, capture_output=True, text=True).stdout) == heads


@pytest.mark.parametrize("step, switch", [(17, "MKL_W13_EMIT_LEAN"), (18, "MKL_ROUTER_WIDE"), (19, "MKL_CHUNK_LEAN"),
                                          (20, "MKL_W13_ACQ_REL")])
def test_steps_17_to_20_stay_step_15_with_their_own_switch_not_production(step: int, switch: str):
    """Steps (o)-(r) were written on step 15 (production then): they keep its switches and their own alone,
    so step 18 (step (p)) has no acq_rel fences and step 20 (step (r)) no wide router; -D stacks either on
    any step (step_p_r: step 20 with -DMKL_ROUTER_WIDE=1, production's switches)."""
    assert_step_is_step_15_with_its_switch_alone(step, switch)
    got = _switches({"MKL_CAMPAIGN_STEP": step})
    for other in PRODUCTION_SWITCHES:
        if other != switch:
            assert got[other] == 0, (step, other)
            assert _switches({"MKL_CAMPAIGN_STEP": step, other: 1})[other] == 1


def test_every_preprocessor_condition_of_the_family_reads_step_10_as_step_g_on_e():
    """The raw `MKL_CAMPAIGN_STEP >= N` / `== N` tests too: step 10 must get step (e)'s and step (g)'s."""
    step10, g_on_e = _conditions(_switches(STEP_10)), _conditions(_switches(STEP_G_ON_E))
    assert len(step10) >= 30, len(step10)  # the kernel's campaign #ifs were found
    assert step10 == g_on_e, {k: (step10[k], g_on_e[k]) for k in step10 if step10[k] != g_on_e[k]}


def test_every_preprocessor_condition_of_the_family_reads_step_14_as_step_10_with_step_l():
    """A raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give 14 what it gives 10; step (l)'s conditions tell them apart."""
    assert_every_condition_reads_step_as(14, 10, "MKL_COPY_AHEAD")


def test_every_preprocessor_condition_of_the_family_reads_step_15_as_step_14_with_step_m():
    """A raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give 15 what it gives 14; step (m)'s conditions tell them apart."""
    assert_every_condition_reads_step_as(15, 14, "MKL_ATTN_MMA")


def test_every_preprocessor_condition_of_the_family_reads_step_21_as_step_15_with_steps_p_and_r():
    """Step 21's value of every condition is the one step 15's switches with MKL_ROUTER_WIDE and MKL_W13_ACQ_REL
    on give, step number 15 included: a raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give 21 what it gives 15; and
    step (p)'s and step (r)'s own conditions are what tell step 21 from step 15. Every condition reads step 21 as
    step_p_r's build (step 20 with -DMKL_ROUTER_WIDE=1)."""
    assert _conditions(_switches(STEP_21)) == _conditions(_switches(STEP_P_R))
    assert_every_condition_reads_step_as(21, 15, *STEP_21_SWITCHES)


def test_every_preprocessor_condition_of_the_family_reads_production_as_step_21_with_step_t():
    """Production's (step 22's) value of every condition is the one step 21's switches with MKL_MERGE_SPLIT on
    give: a raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give 22 what it gives 21 (and so 15); step (t)'s own
    conditions are what tell production from step 21. Every condition reads production as step_t's build (step
    21 with -DMKL_MERGE_SPLIT=1)."""
    prod = _conditions(_switches({}))
    assert prod == _conditions(_switches({"MKL_CAMPAIGN_STEP": 22})) == _conditions(_switches(STEP_T))
    assert_every_condition_reads_step_as(PRODUCTION_STEP, 21, *PRODUCTION_SWITCHES)


def _sass_lines(defines: dict[str, int] | None, label: str) -> list[str]:
    """cuobjdump -sass of the family's source built with `defines` (None: the default build), without
    the lines that name the file or carry the per-build hash of nvcc's internal-linkage names."""
    from hazards.engine import toolchain
    from hazards.engine.errors import ToolchainMissing

    cubin = family_cubin(defines, label).path
    try:
        tool = toolchain.find_tool("cuobjdump", needed_for="to compare the builds' machine code")
    except ToolchainMissing as e:
        pytest.skip(f"cannot read the builds' machine code: {e}")
    text = subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    # the anonymous namespace's mangled name carries per-build hashes (_ZN53_GLOBAL__N__0cc1a6da_20_
    # megakernel_layers_cu_6e0e350f...), as nvcc's internal-linkage names do (_INTERNAL_<hash>)
    text = re.sub(r"_ZN\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}", "_ZN_GLOBAL__N__", text)
    text = re.sub(r"_INTERNAL_[0-9a-f]{8,}", "_INTERNAL_", text)
    return [line for line in text.splitlines() if str(ROOT) not in line and ".cubin" not in line]


def _assert_same_sass(a: list[str], b: list[str]) -> None:
    kernels = [line for line in a if "Function : _ZN3mkl14mkl_megakernel" in line]
    assert len(a) > 10_000 and len(kernels) == 2, kernels  # the kernel with the tripwire compiled in and out
    if a != b:
        diff = [f"{x!r} != {y!r}" for x, y in zip(a, b) if x != y][:5]
        pytest.fail(f"{len(a)} / {len(b)} lines; first differences: {diff}")


PIN = Path(__file__).with_name("production_ptx.json")
UPDATE_PIN = "HZ_UPDATE_PRODUCTION_PIN"
UPDATE_COMMAND = (f"{UPDATE_PIN}=1 PYTHONPATH=$PWD python -m pytest -q -p no:randomly "
                  "tests/megakernel_layers/test_production_step22.py -k pinned")


STANDALONE = ROOT / "standalone"
# The fixed folder the pinned PTX is compiled from (nvcc hashes the source's path into internal names).
PIN_STAGE = Path("/tmp/hz-mkl-ptx-pin/standalone")


@contextlib.contextmanager
def _staged_sources():
    """The family's sources and the headers they include, copied to PIN_STAGE (under a lock: pytest-xdist's
    workers share the folder), yielding it for the compile."""
    PIN_STAGE.parent.mkdir(parents=True, exist_ok=True)
    with open(PIN_STAGE.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            shutil.rmtree(PIN_STAGE, ignore_errors=True)
            copy_sources(PIN_STAGE)
            yield PIN_STAGE
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _production_ptx_digest(defines: dict[str, int] | None = None, label: str = "test-mkl-production-ptx") -> dict[str, object]:
    """The default build's (production's; or the build of `defines`) PTX, as nvcc's front end emits it with the harness build's flags
    (-split-compile=0 and -lineinfo among them), normalised so that it reads the same in every checkout:
    without the `.file` / `.loc` line-info directives and the debug string section (they name the checkout's
    folders and the hashed names as bytes) and with nvcc's
    path-hashed names (the anonymous namespace's _GLOBAL__N__<hash>_..., _INTERNAL_<hash>) read alike.
    The compiler's release, the line count and the lines' sha256.

    Why the PTX and not the machine code: ptxas's register allocation and its choice of which out-of-line
    callee to clone follow those path-hashed names, so the SASS of the same sources differs between
    checkouts (5 attend_chunk stores STG.E or ST.E at `8ff56a0`; 48 lines and a step-14 tripwire body's 4 B
    of spill stores at `7e746ac` between /work/wt/ci12 and /work/wt/ci12b): a SASS pin failed on a
    checkout's name, not on a change. NVVM follows the hashes too (step 15's PTX cloned gemv_round<4> in one
    checkout and not in another: 19,964 against 19,228 lines), so the sources are compiled from one fixed
    folder (_staged_sources), whatever the checkout's."""
    from hazards.engine import toolchain
    from hazards.engine.errors import ToolchainMissing
    from hazards.static.compile import compile_ptx

    try:
        with _staged_sources() as standalone:
            build = compile_ptx(standalone / LAYERED.relative_to(STANDALONE), defines=defines, label=label,
                                extra_args=(f"-I{standalone / INCLUDE.relative_to(STANDALONE)}",), harness_flags=True)
    except ToolchainMissing as e:
        pytest.skip(f"cannot build production's PTX: {e}")
    text = build.path.read_text()
    text = re.split(r"^\s*\.section\s+\.debug", text, maxsplit=1, flags=re.M)[0]  # -lineinfo's name strings
    text = re.sub(r"_ZN\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}", "_ZN_GLOBAL__N__", text)
    text = re.sub(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}", "_GLOBAL__N__", text)
    text = re.sub(r"_INTERNAL_[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}", "_INTERNAL_", text)
    lines = [line.rstrip() for line in text.splitlines()
             if not re.match(r"\s*\.(file|loc)\b", line) and not line.lstrip().startswith("//")]
    nvcc = toolchain.tool_version(str(toolchain.find_tool("nvcc", needed_for="to build production")))
    return {"nvcc": nvcc, "ptx_lines": len(lines), "ptx_sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest()}


def test_production_code_is_the_pinned_one():
    """Production's code (the harness build's PTX, _production_ptx_digest) is the one recorded in
    production_ptx.json: a change to the kernel's sources, headers or build flags that changes it fails
    here until the pin is updated on purpose (a candidate step must leave production alone). With another
    compiler release the pin cannot be compared: the test skips."""
    got = _production_ptx_digest()
    if os.environ.get(UPDATE_PIN) == "1":
        PIN.write_text(json.dumps(got, indent=1) + "\n")
    pin = json.loads(PIN.read_text())
    if got["nvcc"] != pin["nvcc"]:
        pytest.skip(f"the pin was taken with {pin['nvcc']!r}, this compiler is {got['nvcc']!r}")
    assert got == pin, (f"production's code changed ({pin['ptx_lines']} -> {got['ptx_lines']} lines of PTX): a kernel "
                        f"change that changes production must say so and update the pin deliberately: "
                        f"{UPDATE_COMMAND}")


def test_step_10_machine_code_is_step_g_on_e_line_for_line():
    _assert_same_sass(_sass_lines(STEP_10, "test-mkl-step-10"), _sass_lines(STEP_G_ON_E, "test-mkl-step-g-on-e"))


def test_production_code_is_step_t_normalised_ptx_and_not_step_21_or_15():
    """The pinned code is step_t's (-DMKL_CAMPAIGN_STEP=21 -DMKL_MERGE_SPLIT=1, the build the seventeenth session
    gated): the default build's normalised PTX (_production_ptx_digest) equals that build's, and not step 21's
    (step (t)'s merge is in production) or step 15's."""
    prod = _production_ptx_digest()
    assert prod == _production_ptx_digest(STEP_T, "test-mkl-step-t-ptx")
    for step in (15, 21):
        other = _production_ptx_digest({"MKL_CAMPAIGN_STEP": step}, f"test-mkl-step-{step}-ptx")
        assert prod["ptx_sha256"] != other["ptx_sha256"], step


def test_step_21_code_is_step_p_r_normalised_ptx_and_not_step_15_18_or_20():
    """Step 21's build (the production step 22 replaced, candidate step_21) is step_p_r's code (-DMKL_CAMPAIGN_STEP=20
    -DMKL_ROUTER_WIDE=1, round 23's stacked candidate): its normalised PTX equals that build's, and not step 15's,
    step 18's (step (p) alone: step (r)'s fences are in step 21) or step 20's (step (r) alone: step (p)'s router
    is in step 21)."""
    step21 = _production_ptx_digest(STEP_21, "test-mkl-step-21-ptx")
    assert step21 == _production_ptx_digest(STEP_P_R, "test-mkl-step-p-r-ptx")
    for step in (15, 18, 20):
        other = _production_ptx_digest({"MKL_CAMPAIGN_STEP": step}, f"test-mkl-step-{step}-ptx")
        assert step21["ptx_sha256"] != other["ptx_sha256"], step


def test_production_machine_code_is_step_t_line_for_line():
    prod = _sass_lines(None, "test-mkl-step-default")
    _assert_same_sass(prod, _sass_lines(STEP_T, "test-mkl-step-t-sass"))
    assert prod != _sass_lines(STEP_21, "test-mkl-step-21-sass")  # step (t)'s merge is in it


def test_the_catalog_names_the_previous_productions_and_production_code():
    prod, step_21, step_t = FA.candidate("production"), FA.candidate("step_21"), FA.candidate("step_t")
    assert prod.defines == () and "MKL_CAMPAIGN_STEP 22" in prod.what
    assert dict(step_21.defines) == STEP_21 and step_21.expected == "slower"
    assert "production from promote21 until step 22 (the previous production)" in step_21.what
    assert "0.966 [0.960, 0.967]" in step_21.what  # 'slower' read from the two gates of production's code against it
    assert "not production's" in step_21.what  # step (t) sums the merge in another order: no SAME_STEP
    assert dict(step_t.defines) == STEP_T == {"MKL_CAMPAIGN_STEP": 21, "MKL_MERGE_SPLIT": 1}
    assert step_t.expected == "no-change" and "production's code since step 22" in step_t.what
    assert "measured: faster twice, promoted" in step_t.what
    step_15, step_p_r = FA.candidate("step_15"), FA.candidate("step_p_r")
    assert dict(step_15.defines) == STEP_15 and step_15.expected == "slower"
    assert "production from round 20 until step 21 (the production before step 21)" in step_15.what
    assert "previous production" not in step_15.what
    assert "round 24" in step_15.what  # 'slower' read from the three gates of step 21's code against it
    assert "step 21's bits" in step_15.what  # steps (p) and (r) keep them: promote21's SAME_STEP 15
    assert dict(step_p_r.defines) == STEP_P_R == {"MKL_CAMPAIGN_STEP": 20, "MKL_ROUTER_WIDE": 1}
    assert step_p_r.expected == "slower" and "step 21's code" in step_p_r.what
    assert "production's code" not in step_p_r.what
    # steps (p) and (r) alone keep their builds (step 15 with one switch): neither is production's code
    step_p, step_r = FA.candidate("step_p"), FA.candidate("step_r")
    assert dict(step_p.defines) == {"MKL_CAMPAIGN_STEP": 18} and dict(step_r.defines) == {"MKL_CAMPAIGN_STEP": 20}
    assert "production's code" not in step_p.what and "production's code" not in step_r.what
    step_14, step_m = FA.candidate("step_14"), FA.candidate("step_m")
    assert dict(step_14.defines) == STEP_14 and step_14.expected == "slower"
    assert "production from round 18 until step 15" in step_14.what and "previous production" not in step_14.what
    assert dict(step_m.defines) == STEP_15 and step_m.expected == "slower" and "step_15's" in step_m.what
    step_10, step_l = FA.candidate("step_10"), FA.candidate("step_l")
    assert dict(step_10.defines) == STEP_10 and step_10.expected == "slower"
    assert "production from round 14 until step 14" in step_10.what
    assert dict(step_l.defines) == STEP_14 and step_l.expected == "slower"  # step 14's code, no longer production's
    step_d, g_on_e = FA.candidate("step_d"), FA.candidate("step_g_on_e")
    assert dict(step_d.defines) == {"MKL_CAMPAIGN_STEP": 5} and step_d.expected == "slower"
    assert "production from round 8 until step 10" in step_d.what
    assert g_on_e.expected == "slower" and "step 10's code" in g_on_e.what
    # candidates whose expectation was against step 10 (no-change) read against step 14, then 15, 21, 22
    assert FA.candidate("step_e").expected == "slower" and FA.candidate("step_g").expected == "slower"
    for name in ("step_i", "step_j", "step_k"):  # built on step 10, not on production
        assert "step 10 (its base, step_10)" in FA.candidate(name).what, name
    for name in ("step_o", "step_p", "step_q", "step_r"):  # built on step 15, production then
        assert "step 15 (its base, production then; step_15)" in FA.candidate(name).what, name


def test_the_gpu_suite_prebuilds_every_campaign_build_test_gpu_runs():
    """final-gpu-tests.sh builds test_gpu.py's campaign builds in parallel before pytest (else each is
    built inside pytest, 10-16 s each); step (d), step 10, step 14, step 15 and step 21 are named builds since
    step 22 is production."""
    script = (ROOT / "ci" / "gpu" / "final-gpu-tests.sh").read_text()
    steps = script[script.index("steps = ["):script.index("]\n", script.index("steps = ["))]
    tests = (ROOT / "tests" / "megakernel_layers" / "test_gpu.py").read_text()
    wanted = {int(n) for n in re.findall(r'\{"MKL_CAMPAIGN_STEP": (\d+)\}', tests)}
    for a, b in re.findall(r"assert_same_bits\((\d+), (\d+),", tests):
        wanted |= {int(a), int(b)}
    for a, b in re.findall(r"for step in \((\d+), (\d+)\)", tests):
        wanted |= {int(a), int(b)}
    assert {5, 10, 14, 15, 21} <= wanted and 22 not in wanted  # steps (d), 10, 14, 15, 21 named; production is the default build
    for n in wanted:
        assert f'{{"MKL_CAMPAIGN_STEP": {n}}}' in steps, n
    assert '{"MKL_CAMPAIGN_STEP": 8, "MKL_ATTN_AHEAD": 0}' in steps
    # the stacked candidates test_gpu.py compares bits of (two defines: the pattern above reads one)
    for stacked in re.findall(r'^STEP_\w+ = (\{"MKL_CAMPAIGN_STEP": \d+, [^}]*\})$', tests, re.M):
        assert stacked in steps, stacked
    # the other GPU test files' builds (their module-level STEP_* / BASE dicts, and steps (u)'s and (v)'s negative
    # controls, CONTROL_*)
    for name in ("test_w13_emit_lean.py", "test_hn_first.py", "test_merge_split.py", "test_oproj_stage.py",
                 "test_attn_stage.py"):
        other = (ROOT / "tests" / "megakernel_layers" / name).read_text()
        builds = re.findall(r'^(?:STEP_\w+|BASE|CONTROL_\w+) = (\{"MKL_\w+": \d+[^}]*\})', other, re.M)
        assert builds, name
        for build in builds:
            assert build in steps, (name, build)


def test_production_passes_the_compiled_static_checks_with_step_15s_polls():
    """Steps (p), (r) and (t) add no wait and move none: production's build (and step 21's) passes the compiled
    static checks with step 15's poll count."""
    assert_static_checks_pass_with_the_polls_of(PRODUCTION_STEP, 15)
    assert_static_checks_pass_with_the_polls_of(21, 15)
