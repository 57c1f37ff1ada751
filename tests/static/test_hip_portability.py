"""Every runtime family source compiles as HIP for gfx942 (clang-19) and gfx950 (clang-22)
against the installed ROCm headers (device side to assembly, host side checked with
-fsyntax-only: no ROCm linker or GPU here),
and the replies a HIP build gives for what it cannot run are `unsupported`, not bad requests."""
from __future__ import annotations

import subprocess

import pytest

from hazards.engine import toolchain
from hazards.engine.classify import classify_reply
from hazards.engine.outcome import Outcome
from hazards.engine.protocol import validate_reply
from hazards.families import all_families
from hazards.engine.errors import ToolchainMissing
from hazards.static.userbuild import device_lib_args, hip_device_args, hip_headers_found
from static_helpers import REPO

# Families whose kernel has no HIP counterpart, and why (the test says so, never passes them).
CUDA_ONLY = {
    "mma_pingpong": "its kernel is sm_90a wgmma PTX (tensor-core async MMA): no HIP counterpart",
    "megakernel_layers": "an sm_90a megakernel: inline PTX (ld.global.nc.L1::no_allocate, "
                         "cp.async.bulk.prefetch.L2, st.global.wt), cuda_bf16/cuda_fp8 types",
}
RUNTIME = sorted(f.name for f in all_families() if f.binary)


def _hip_missing(arch: str) -> str | None:
    try:
        clang = toolchain.find_tool("clang", arch=arch)
    except ToolchainMissing as e:
        return str(e)
    if not hip_headers_found(clang):
        return "ROCm's HIP headers are not installed (apt-get install libamdhip64-dev)"
    if "-nogpulib" in device_lib_args(clang, arch):
        return "ROCm's device libraries are not installed (apt-get install rocm-device-libs)"
    return None


@pytest.mark.parametrize("arch", toolchain.AMD_ARCHS)
@pytest.mark.parametrize("family", RUNTIME)
def test_every_runtime_family_source_compiles_as_hip(family, arch, tmp_path):
    if family in CUDA_ONLY:
        pytest.skip(f"{family} is CUDA-only: {CUDA_ONLY[family]}")
    if (why := _hip_missing(arch)) is not None:
        pytest.skip(why)
    clang = toolchain.find_tool("clang", arch=arch)
    src = REPO / "standalone" / family / f"{family}.cu"
    device_args = hip_device_args(clang, arch)  # the device libraries, the wave-size macro clang 22 dropped
    device = subprocess.run([clang, *device_args, f"-I{REPO / 'standalone'}", str(src), "-O1", "-S",
                             "-o", str(tmp_path / "device.s")], capture_output=True, text=True, timeout=600)
    assert device.returncode == 0, device.stderr[-3000:]
    assert f"amdgcn-amd-amdhsa--{arch}" in (tmp_path / "device.s").read_text()
    wave = [a for a in device_args if a.startswith("-D__AMDGCN_WAVEFRONT_SIZE")]
    host = subprocess.run([clang, "-x", "hip", toolchain.amd_arch_flag(arch), *wave, f"-I{REPO / 'standalone'}",
                           str(src), "--cuda-host-only", "-fsyntax-only"], capture_output=True, text=True,
                          timeout=600)
    assert host.returncode == 0, host.stderr[-3000:]


def test_the_cuda_only_exceptions_name_real_runtime_families():
    assert set(CUDA_ONLY) <= set(RUNTIME)


def test_an_unsupported_reply_is_its_own_error_kind_not_a_bad_request():
    reply = validate_reply({"id": 3, "status": "unsupported", "message": "copy=cp_async needs CUDA sm_80+"}, 3)
    outcome, reason, evidence = classify_reply(reply)
    assert outcome is Outcome.ERROR and evidence.get("error_kind") == "unsupported"
    assert "unsupported" in reason and "bad_request" not in reason


@pytest.mark.parametrize("arch", toolchain.AMD_ARCHS)
def test_half_precision_math_of_the_installed_hip_headers_compiles_for_each_target(arch, tmp_path):
    # HIP 5.2's hip_fp16.h takes __llvm_amdgcn_rcp_f16 from clang's HIP wrapper, which clang 22
    # dropped: the project's own declaration (hazards/static/hip_compat) stands in for it
    if (why := _hip_missing(arch)) is not None:
        pytest.skip(why)
    clang = toolchain.find_tool("clang", arch=arch)
    src = tmp_path / "half.hip"
    src.write_text("#include <hip/hip_runtime.h>\n#include <hip/hip_fp16.h>\n"
                   "__global__ void k(__half* p, __half2* q) { p[0] = hrcp(p[0]); q[0] = h2rcp(q[0]); }\n")
    proc = subprocess.run([clang, *hip_device_args(clang, arch), "-O3", "-S", str(src), "-o", str(tmp_path / "half.s")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "v_rcp_f16" in (tmp_path / "half.s").read_text()
