"""Production is campaign step 15 (promote15; faster in round 19, promoted in round 20): step 14 + step (m), candidate
step_m's code.
Step 14 (MKL_CAMPAIGN_STEP 14, candidate step_14: production from round 18 until step 15, promote14)
is step 10 + step (l), candidate step_l's code. Step 10 (MKL_CAMPAIGN_STEP 10, candidate step_10:
production from round 14 until step 14, promote10) is step (e) + step (g), candidate step_g_on_e's
code (MKL_CAMPAIGN_STEP 8 with MKL_ATTN_AHEAD 0), without step (f) and step (h).

On the CPU: production's campaign switches are step 14's plus MKL_ATTN_MMA and nothing else (step
14's are step 10's plus MKL_COPY_AHEAD), and every preprocessor condition of the family's sources
reads the default build as step 14 with step (m)'s switch on (a raw `MKL_CAMPAIGN_STEP >= N` / `== N`
must give 15 step 14's value; step 14 reads as step 10 with step (l)'s switch on); the default
build's machine code (cuobjdump -sass, nvcc 13.0, sm_90a) is step_m's (MKL_CAMPAIGN_STEP=15) line for
line, and not step 14's, and its code (the harness build's PTX, its path-hashed names and line info read
alike in every checkout) is the one pinned in production_ptx.json (the compiler's release, line count and
sha256); a change that changes it updates the pin on purpose (UPDATE_COMMAND). The step-10 build keeps promote10's facts: every switch and condition takes
step_g_on_e's value (step (e)'s but for step (g)'s switch), and its machine code is step_g_on_e's
line for line. The catalog names the previous productions (step_14 and step_10, expected slower than
production) and step_m as production's code (no-change); the GPU suite's prebuilt builds hold every
build test_gpu.py compares. With the default left at 14 (promote14's tree), the tests of production's
switches, conditions, machine code and catalog entry fail.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from hazards.megakernel_layers import faithful as FA

from .test_merge_spread import INCLUDE, LAYERED, ROOT, family_cubin

KERNEL = ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh"
SWITCHES = ("MKL_CAMPAIGN_STEP", "MKL_ROUTER_FOLDED", "MKL_WEIGHT_RING", "MKL_MERGE_SPREAD", "MKL_ROUTER_LATENCY",
            "MKL_ATTN_AHEAD", "MKL_W2_QUANT_AHEAD", "MKL_HEAD_AHEAD", "MKL_GEMV_ONE_ROUND", "MKL_QKV_SPREAD", "MKL_L2_KEEP_QKV",
            "MKL_COPY_AHEAD", "MKL_ATTN_MMA", "MKL_W13_EMIT_LEAN", "MKL_ROUTER_WIDE", "MKL_CHUNK_LEAN",
            "MKL_W13_ACQ_REL", "MKL_RESERVE_RING_SMEM")
STEP_G_ON_E = dict(FA.candidate("step_g_on_e").defines)
STEP_10 = {"MKL_CAMPAIGN_STEP": 10}
STEP_14 = {"MKL_CAMPAIGN_STEP": 14}


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


def assert_step_is_production_with_its_switch_alone(step: int, switch: str) -> None:
    """Campaign step `step` sets every switch as production does but `switch` (on) and the step number; only
    that step turns `switch` on (steps 0-20), production leaves it off, and -D sets it either way beside any
    step (a candidate on production: steps (o), (p), (q))."""
    changed, prod, got = switches_changed_from_step(15, {"MKL_CAMPAIGN_STEP": step})
    assert changed == {"MKL_CAMPAIGN_STEP", switch}, changed
    assert got[switch] == 1 and prod[switch] == 0 and _switches({})[switch] == 0
    assert [n for n in range(21) if _switches({"MKL_CAMPAIGN_STEP": n})[switch]] == [step]
    assert _switches({"MKL_CAMPAIGN_STEP": 15, switch: 1})[switch] == 1
    assert _switches({"MKL_CAMPAIGN_STEP": step, switch: 0})[switch] == 0


def assert_every_condition_reads_step_as_production_with(step: int, switch: str) -> None:
    """Every preprocessor condition of the family reads campaign step `step` as production's switches with
    `switch` on (a raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give the step what it gives 15), and some
    condition reads `switch` (the step's code differs from production's)."""
    got = _conditions(_switches({"MKL_CAMPAIGN_STEP": step}))
    with_switch = _conditions({**_switches({}), switch: 1})
    assert len(got) >= 30, len(got)  # the kernel's campaign #ifs were found
    assert got == with_switch, {k: (got[k], with_switch[k]) for k in got if got[k] != with_switch[k]}
    prod = _conditions(_switches({}))
    assert {k for k in got if got[k] != prod[k]}, f"no condition reads {switch}"


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


def test_production_takes_step_14_switches_and_step_m_alone():
    from hazards.megakernel_layers import model as M

    prod = _switches({})
    assert prod["MKL_CAMPAIGN_STEP"] == 15 and _switches({"MKL_CAMPAIGN_STEP": 15}) == prod
    assert M.DEFAULT_CAMPAIGN_STEP == 15  # the schedule model reads a build without -D as production
    changed, _, _ = switches_changed_from_step_14({})
    assert changed == {"MKL_CAMPAIGN_STEP", "MKL_ATTN_MMA"}, changed
    assert prod["MKL_ATTN_MMA"] == 1 and prod["MKL_COPY_AHEAD"] == 1 and prod["MKL_W2_QUANT_AHEAD"] == 1
    # steps (i), (j) and (k) stay off in production
    assert prod["MKL_GEMV_ONE_ROUND"] == prod["MKL_QKV_SPREAD"] == prod["MKL_L2_KEEP_QKV"] == 0


def test_every_preprocessor_condition_of_the_family_reads_step_10_as_step_g_on_e():
    """The raw `MKL_CAMPAIGN_STEP >= N` / `== N` tests too: step 10 must get step (e)'s and step (g)'s."""
    step10, g_on_e = _conditions(_switches(STEP_10)), _conditions(_switches(STEP_G_ON_E))
    assert len(step10) >= 30, len(step10)  # the kernel's campaign #ifs were found
    assert step10 == g_on_e, {k: (step10[k], g_on_e[k]) for k in step10 if step10[k] != g_on_e[k]}


def test_every_preprocessor_condition_of_the_family_reads_step_14_as_step_10_with_step_l():
    """Step 14's value of every condition is the one step 10's switches with MKL_COPY_AHEAD on give, step
    number 10 included: a raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give 14 what it gives 10."""
    step14 = _conditions(_switches(STEP_14))
    with_l = _conditions({**_switches(STEP_10), "MKL_COPY_AHEAD": 1})
    assert len(step14) >= 30, len(step14)
    assert step14 == with_l, {k: (step14[k], with_l[k]) for k in step14 if step14[k] != with_l[k]}
    # and step (l)'s own conditions are what tells step 14 from step 10
    step10 = _conditions(_switches(STEP_10))
    assert {k for k in step14 if step14[k] != step10[k]}, "no condition reads MKL_COPY_AHEAD"


def test_every_preprocessor_condition_of_the_family_reads_production_as_step_14_with_step_m():
    """Production's value of every condition is the one step 14's switches with MKL_ATTN_MMA on give, step
    number 14 included: a raw `MKL_CAMPAIGN_STEP >= N` / `== N` must give 15 what it gives 14."""
    prod = _conditions(_switches({}))
    with_m = _conditions({**_switches(STEP_14), "MKL_ATTN_MMA": 1})
    assert len(prod) >= 30, len(prod)
    assert prod == with_m, {k: (prod[k], with_m[k]) for k in prod if prod[k] != with_m[k]}
    # and step (m)'s own conditions are what tells production from step 14
    step14 = _conditions(_switches(STEP_14))
    assert {k for k in prod if prod[k] != step14[k]}, "no condition reads MKL_ATTN_MMA"


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
                  "tests/megakernel_layers/test_production_step15.py -k pinned")


def _production_ptx_digest() -> dict[str, object]:
    """The default build's (production's) PTX, as nvcc's front end emits it with the harness build's flags
    (-split-compile=0 and -lineinfo among them), normalised so that it reads the same in every checkout:
    without the `.file` / `.loc` line-info directives and the debug string section (they name the checkout's
    folders and the hashed names as bytes) and with nvcc's
    path-hashed names (the anonymous namespace's _GLOBAL__N__<hash>_..., _INTERNAL_<hash>) read alike.
    The compiler's release, the line count and the lines' sha256.

    Why the PTX and not the machine code: ptxas's register allocation and its choice of which out-of-line
    callee to clone follow those path-hashed names, so the SASS of the same sources differs between
    checkouts (5 attend_chunk stores STG.E or ST.E at `8ff56a0`; 48 lines and a step-14 tripwire body's 4 B
    of spill stores at `7e746ac` between /work/wt/ci12 and /work/wt/ci12b): a SASS pin failed on a
    checkout's name, not on a change. The PTX is everything the sources and flags decide."""
    from hazards.engine import toolchain
    from hazards.engine.errors import ToolchainMissing
    from hazards.static.compile import compile_ptx

    try:
        build = compile_ptx(LAYERED, defines=None, label="test-mkl-production-ptx", extra_args=(f"-I{INCLUDE}",),
                            harness_flags=True)
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


def test_production_machine_code_is_step_m_line_for_line():
    prod = _sass_lines(None, "test-mkl-step-default")
    _assert_same_sass(prod, _sass_lines({"MKL_CAMPAIGN_STEP": 15}, "test-mkl-step-15-sass"))
    assert prod != _sass_lines(STEP_14, "test-mkl-step-l")  # step (m)'s tensor-core block loop is in it


def test_the_catalog_names_the_previous_productions_and_production_code():
    prod, step_14, step_m = FA.candidate("production"), FA.candidate("step_14"), FA.candidate("step_m")
    assert prod.defines == () and "MKL_CAMPAIGN_STEP 15" in prod.what
    assert dict(step_14.defines) == STEP_14 and step_14.expected == "slower"
    assert "production from round 18 until step 15" in step_14.what
    assert dict(step_m.defines) == {"MKL_CAMPAIGN_STEP": 15}
    assert step_m.expected == "no-change" and "production's code" in step_m.what
    step_10, step_l = FA.candidate("step_10"), FA.candidate("step_l")
    assert dict(step_10.defines) == STEP_10 and step_10.expected == "slower"
    assert "production from round 14 until step 14" in step_10.what
    assert dict(step_l.defines) == STEP_14 and step_l.expected == "slower"  # step 14's code, no longer production's
    step_d, g_on_e = FA.candidate("step_d"), FA.candidate("step_g_on_e")
    assert dict(step_d.defines) == {"MKL_CAMPAIGN_STEP": 5} and step_d.expected == "slower"
    assert "production from round 8 until step 10" in step_d.what
    assert g_on_e.expected == "slower" and "step 10's code" in g_on_e.what
    # candidates whose expectation was against step 10 (no-change) read against step 14, then step 15
    assert FA.candidate("step_e").expected == "slower" and FA.candidate("step_g").expected == "slower"
    for name in ("step_i", "step_j", "step_k"):  # built on step 10, not on production
        assert "step 10 (its base, step_10)" in FA.candidate(name).what, name


def test_the_gpu_suite_prebuilds_every_campaign_build_test_gpu_runs():
    """final-gpu-tests.sh builds test_gpu.py's campaign builds in parallel before pytest (else each is
    built inside pytest, 10-16 s each); step (d), step 10 and step 14 are named builds since step 15 is
    production."""
    script = (ROOT / "ci" / "gpu" / "final-gpu-tests.sh").read_text()
    steps = script[script.index("steps = ["):script.index("]\n", script.index("steps = ["))]
    tests = (ROOT / "tests" / "megakernel_layers" / "test_gpu.py").read_text()
    wanted = {int(n) for n in re.findall(r'\{"MKL_CAMPAIGN_STEP": (\d+)\}', tests)}
    for a, b in re.findall(r"assert_same_bits\((\d+), (\d+),", tests):
        wanted |= {int(a), int(b)}
    for a, b in re.findall(r"for step in \((\d+), (\d+)\)", tests):
        wanted |= {int(a), int(b)}
    assert {5, 10, 14} <= wanted and 15 not in wanted  # steps (d), 10 and 14 named; production is the default build
    for n in wanted:
        assert f'{{"MKL_CAMPAIGN_STEP": {n}}}' in steps, n
    assert '{"MKL_CAMPAIGN_STEP": 8, "MKL_ATTN_AHEAD": 0}' in steps
    # the stacked candidates test_gpu.py compares bits of (two defines: the pattern above reads one)
    for stacked in re.findall(r'^STEP_\w+ = (\{"MKL_CAMPAIGN_STEP": \d+, [^}]*\})$', tests, re.M):
        assert stacked in steps, stacked
