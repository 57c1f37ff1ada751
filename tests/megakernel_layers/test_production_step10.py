"""Production is campaign step 10 (promote10): step (e) + step (g), candidate step_g_on_e's code
(MKL_CAMPAIGN_STEP 8 with MKL_ATTN_AHEAD 0), without step (f) and step (h).

On the CPU: every campaign switch and every preprocessor condition of the family's sources takes
step_g_on_e's value in the default build and step (e)'s but for step (g)'s switch; the default
build's machine code (cuobjdump -sass, nvcc 13.0, sm_90a) is step_g_on_e's line for line; the
catalog names the previous production (step_d, expected slower than production) and step_g_on_e
as production's code (no-change); the GPU suite's prebuilt builds hold every build test_gpu.py
compares. Before this change the default build was step (d) (MKL_CAMPAIGN_STEP 5), and with step
10 defined but MKL_W2_QUANT_AHEAD left at `== 8` the default build was step (e)'s: both tests of
the switches and of the SASS fail there.
"""
from __future__ import annotations

import re
import subprocess

import pytest

from hazards.megakernel_layers import faithful as FA

from .test_merge_spread import ROOT, family_cubin

KERNEL = ROOT / "standalone" / "megakernel_layers" / "mkl_kernel.cuh"
SWITCHES = ("MKL_CAMPAIGN_STEP", "MKL_ROUTER_FOLDED", "MKL_WEIGHT_RING", "MKL_MERGE_SPREAD", "MKL_ROUTER_LATENCY",
            "MKL_ATTN_AHEAD", "MKL_W2_QUANT_AHEAD", "MKL_HEAD_AHEAD", "MKL_GEMV_ONE_ROUND", "MKL_QKV_SPREAD", "MKL_L2_KEEP_QKV",
            "MKL_COPY_AHEAD",
            "MKL_RESERVE_RING_SMEM")
STEP_G_ON_E = dict(FA.candidate("step_g_on_e").defines)


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


def test_production_takes_step_g_on_e_switches_and_step_e_but_for_step_g():
    prod, g_on_e, step_e = _switches({}), _switches(STEP_G_ON_E), _switches({"MKL_CAMPAIGN_STEP": 6})
    assert prod["MKL_CAMPAIGN_STEP"] == 10
    assert {k: v for k, v in prod.items() if k != "MKL_CAMPAIGN_STEP"} == \
        {k: v for k, v in g_on_e.items() if k != "MKL_CAMPAIGN_STEP"}
    assert {k for k in SWITCHES if prod[k] != step_e[k]} == {"MKL_CAMPAIGN_STEP", "MKL_W2_QUANT_AHEAD"}
    assert prod["MKL_W2_QUANT_AHEAD"] == 1 and prod["MKL_ATTN_AHEAD"] == 0 and prod["MKL_HEAD_AHEAD"] == 0
    assert prod["MKL_ROUTER_LATENCY"] == prod["MKL_ROUTER_FOLDED"] == prod["MKL_MERGE_SPREAD"] == 1
    assert _switches({"MKL_CAMPAIGN_STEP": 10}) == prod
    # the previous production and the candidates keep their switches
    assert _switches({"MKL_CAMPAIGN_STEP": 5})["MKL_W2_QUANT_AHEAD"] == 0
    assert _switches({"MKL_CAMPAIGN_STEP": 8})["MKL_ATTN_AHEAD"] == 1
    assert _switches({"MKL_CAMPAIGN_STEP": 9})["MKL_W2_QUANT_AHEAD"] == 0


def test_every_preprocessor_condition_of_the_family_reads_production_as_step_g_on_e():
    """The raw `MKL_CAMPAIGN_STEP >= N` / `== N` tests too: step 10 must get step (e)'s and step (g)'s."""
    prod, g_on_e = _conditions(_switches({})), _conditions(_switches(STEP_G_ON_E))
    assert len(prod) >= 30, len(prod)  # the kernel's campaign #ifs were found
    assert prod == g_on_e, {k: (prod[k], g_on_e[k]) for k in prod if prod[k] != g_on_e[k]}


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


def test_production_machine_code_is_step_g_on_e_line_for_line():
    prod = _sass_lines(None, "test-mkl-step-default")
    g_on_e = _sass_lines(STEP_G_ON_E, "test-mkl-step-g-on-e")
    kernels = [line for line in prod if "Function : _ZN3mkl14mkl_megakernel" in line]
    assert len(prod) > 10_000 and len(kernels) == 2, kernels  # the kernel with the tripwire compiled in and out
    if prod != g_on_e:
        diff = [f"{a!r} != {b!r}" for a, b in zip(prod, g_on_e) if a != b][:5]
        pytest.fail(f"{len(prod)} / {len(g_on_e)} lines; first differences: {diff}")


def test_the_catalog_names_the_previous_production_and_production_code():
    prod, step_d, g_on_e = FA.candidate("production"), FA.candidate("step_d"), FA.candidate("step_g_on_e")
    assert prod.defines == () and "MKL_CAMPAIGN_STEP 10" in prod.what
    assert dict(step_d.defines) == {"MKL_CAMPAIGN_STEP": 5} and step_d.expected == "slower"
    assert "production from round 8 until step 10" in step_d.what
    assert g_on_e.expected == "no-change" and "production's code" in g_on_e.what
    # candidates whose expectation was against step (d) now read against step 10
    assert FA.candidate("step_e").expected == "slower" and FA.candidate("step_g").expected == "no-change"


def test_the_gpu_suite_prebuilds_every_campaign_build_test_gpu_runs():
    """final-gpu-tests.sh builds test_gpu.py's campaign builds in parallel before pytest (else each is
    built inside pytest, 10-16 s each); step (d) is a named build since step 10 is production."""
    script = (ROOT / "ci" / "gpu" / "final-gpu-tests.sh").read_text()
    steps = script[script.index("steps = ["):script.index("]\n", script.index("steps = ["))]
    tests = (ROOT / "tests" / "megakernel_layers" / "test_gpu.py").read_text()
    wanted = {int(n) for n in re.findall(r'\{"MKL_CAMPAIGN_STEP": (\d+)\}', tests)}
    for a, b in re.findall(r"assert_same_bits\((\d+), (\d+),", tests):
        wanted |= {int(a), int(b)}
    for a, b in re.findall(r"for step in \((\d+), (\d+)\)", tests):
        wanted |= {int(a), int(b)}
    assert 5 in wanted and 10 not in wanted  # step (d) named; production is the default build
    for n in wanted:
        assert f'{{"MKL_CAMPAIGN_STEP": {n}}}' in steps, n
    assert '{"MKL_CAMPAIGN_STEP": 8, "MKL_ATTN_AHEAD": 0}' in steps
