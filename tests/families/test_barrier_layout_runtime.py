"""`barrier_layout` as a runtime family: the binary agrees with the catalog, its spins are
bounded, and on a GPU the layouts, release kinds and polls behave as the docs say.

CPU part (skipped without nvcc / nvdisasm): `--list` and out-of-range requests answer
without a GPU, and the runtime build's SASS is checked with the project's own SASS checks.
GPU part (`@pytest.mark.gpu`): one warm server serves every test.
"""
from __future__ import annotations

import json
import math
import subprocess

import pytest

from hazards.families import barrier_layout as bl
from hazards.families import get_family
from hazards.engine.gpus import gpu_available
from hazards.engine.outcome import Outcome
from hazards.engine.toolchain import SM90A

FAMILY = get_family("barrier_layout")
# Variants that must run clean on NVIDIA: the fixed ones, and the two layout canaries whose
# hazard is AMD's (lost release) or a cost (false sharing), not a wrong result.
CLEAN_ON_NVIDIA = [v.name for v in FAMILY.clean_variants] + ["broken_shared_line", "broken_false_sharing"]
CLEAN_LAUNCHES = 2000


@pytest.fixture(scope="module")
def exe():
    from hazards.engine.build import find_compiler
    from hazards.engine.errors import ToolchainMissing
    from hazards.stress_family import family_binary

    try:
        find_compiler(SM90A)
    except ToolchainMissing as e:
        pytest.skip(f"nvcc not available, cannot compile for sm_90a: {e}")
    return family_binary(FAMILY)


# ------------------------------------------------------------------------------ CPU --
def test_family_declares_its_runtime_binary_and_its_spin_counter():
    assert FAMILY.binary == "barrier_layout" and FAMILY.source_dir == "barrier_layout"
    assert "spin_timeouts" in FAMILY.counters and not FAMILY.harness_anomalies


@pytest.mark.parametrize("params, fragment", [
    ({"slot_stride": 2}, "outside [4, 1024]"),
    ({"poll": 3}, "outside [0, 2]"),
    ({"release": -1}, "outside [0, 2]"),
    ({"spin_timeout_us": 0}, "outside [10,"),
    ({"variant": "broken_lost_release"}, "unknown variant"),
])
def test_out_of_range_requests_exit_2_before_touching_the_gpu(exe, params, fragment):
    out = subprocess.run([str(exe), "--once", json.dumps(params)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    payload = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("HZ_RESULT "))[10:])
    assert payload["status"] == "bad_request" and fragment in payload["message"]


def test_runtime_build_has_only_bounded_spins_and_keeps_the_poll_semantics(exe):
    """The SASS checks over the runtime build (all 9 poll x release instances): no loop that
    cannot exit (every spin is bounded), the volatile-poll instances still read data with
    no acquire (the canary is the same code), and the plain poll is hoisted out of its loop
    (no poll loop at all: at run time it waits on the clock until the limit)."""
    from hazards.engine.toolchain import find_tool
    from hazards.static import compile as hz_compile
    from hazards.static import sass
    from hazards.engine.errors import ToolchainMissing

    try:
        find_tool("nvdisasm")
    except ToolchainMissing as e:
        pytest.skip(str(e))
    listing = hz_compile.disassemble(hz_compile.compile_cubin(bl.SOURCE, label="barrier_layout-runtime").path)
    kernels = {f.name: f for f in sass.parse_sass(listing.text) if "hz_barrier_kernel" in f.name}
    assert len(kernels) == 9
    for name, func in kernels.items():
        poll = int(name.split("hz_barrier_kernelILi")[1][0])
        found = sass.check_spin_loops(func, "x") + sass.check_polls(func, "x")
        checks = {f.check for f in found}
        assert "spin-no-load" not in checks, name
        assert ("poll-no-acquire" in checks) is (poll == 1), (name, checks)
        assert ("sync-scope" in checks or "poll-no-acquire" in checks) is (poll != 2), (name, checks)


def test_runtime_request_fields_that_emulate_a_lost_release_make_a_point_hazardous():
    assert not bl.static_model({"variant": "fixed"}).hazardous
    verdict = bl.static_model({"variant": "fixed", "drop_release": 3})
    assert verdict.hazardous and "drop_release" in verdict.reason


@pytest.mark.parametrize("release, expect", [(0, {"layout-wt-l2-line"}), (1, set()), (2, set())])
def test_only_write_through_releases_make_the_shared_line_lose_releases(release, expect):
    point = {"variant": "broken_shared_line", "release": release}
    assert bl.predicted_checks(point) == expect


# ------------------------------------------------------------------------------ GPU --
# The `gpu` marker skips these through the project's pytest plugin; the skipif keeps them
# skipped when the plugin is not loaded.
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable NVIDIA GPU (NVML/nvidia-smi found none)")


@pytest.fixture(scope="module")
def server(exe):
    from hazards.engine.targets import ServerTarget

    target = ServerTarget([str(exe.resolve()), "--serve"], name="barrier_layout")
    yield target
    target.close()


def _run(server, params, launches, timeout=60.0):
    r = server.run(params, timeout=timeout, launches=launches)
    assert r.outcome not in (Outcome.ERROR, Outcome.HANG, Outcome.FAULT), f"{params}: {r.outcome} {r.reason}"
    return r


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", CLEAN_ON_NVIDIA)
def test_layouts_and_release_kinds_run_clean_on_nvidia(server, variant):
    """On NVIDIA the L2 is the point of coherence: the MoE barrier report's shared line loses
    nothing."""
    r = _run(server, {"variant": variant}, CLEAN_LAUNCHES)
    m = r.metrics
    assert r.outcome is Outcome.CLEAN, f"{variant}: {r.reason} {m}"
    assert m["launches"] == CLEAN_LAUNCHES and m["mismatched"] == 0
    assert m["spin_timeouts"] == 0 and m["bad_final_words"] == 0 and m["wrong_words"] == 0


@pytest.mark.gpu
@needs_gpu
def test_poll_without_acquire_reads_stale_data_words(server):
    r = _run(server, {"variant": "broken_no_acquire"}, FAMILY.default_launches)
    m = r.metrics
    assert r.outcome is Outcome.MISMATCH, f"{r.reason} {m}"
    assert m["wrong_words"] > 0 and m["spin_timeouts"] == 0


@pytest.mark.gpu
@needs_gpu
def test_hoisted_poll_is_a_counted_timeout_not_a_hang(server):
    launches = 10
    r = _run(server, {"variant": "broken_hoisted_poll"}, launches, timeout=20.0)
    m = r.metrics
    assert r.outcome is Outcome.MISMATCH, f"{r.reason} {m}"
    assert m["spin_timeouts"] >= 1 and m["aborted_launches"] >= 1
    # the next request on the same server starts from a reset barrier
    assert _run(server, {"variant": "fixed"}, 50).outcome is Outcome.CLEAN


@pytest.mark.gpu
@needs_gpu
def test_an_emulated_lost_release_times_out_in_every_launch_and_the_server_recovers(server):
    launches = 5
    r = _run(server, {"variant": "fixed", "drop_release": 7, "spin_timeout_us": 5000}, launches, timeout=20.0)
    m = r.metrics
    assert r.outcome is Outcome.MISMATCH, f"{r.reason} {m}"
    assert m["mismatched"] == launches and m["aborted_launches"] == launches and m["spin_timeouts"] >= launches
    assert _run(server, {"variant": "fixed"}, 50).outcome is Outcome.CLEAN


@pytest.mark.gpu
@needs_gpu
def test_the_device_clock_gives_a_cost_per_barrier_round(server):
    launches = 100
    r = _run(server, {"variant": "fixed"}, launches)
    m = r.metrics
    assert r.outcome is Outcome.CLEAN
    assert m["barrier_rounds"] == launches * FAMILY.defaults["epochs"]
    assert math.isfinite(m["ns_per_barrier"]) and m["ns_per_barrier"] > 0
    assert m["device_ns"] <= m["kernel_ms"] * 1e6  # inside the CUDA-event window
