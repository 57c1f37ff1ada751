"""The system side of a hang report: NVML state with the run's processes marked, the Xid
events a running monitor received, and the kernel log's Xid lines since the run began."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from hazards.engine import telemetry
from hazards.engine.forensics.system import describe_system, system_report
from hazards.engine.telemetry import KernelLog, TelemetryMonitor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "campaign"))
from fake_nvml import FakeNvml  # noqa: E402  (the campaign tests' NVML fake)


@pytest.fixture
def nvml_one_gpu():
    nv = FakeNvml(["GPU-aaaa"])
    telemetry.use_nvml(nv)
    yield nv
    telemetry.use_nvml(None)


def test_gpu_state_marks_the_runs_processes_and_lists_xids_since_it_began(nvml_one_gpu):
    nv = nvml_one_gpu
    nv.procs["GPU-aaaa"] = [4242, 99]
    with TelemetryMonitor(["GPU-aaaa"], sample_every_s=0.05) as mon:
        nv.post_xid("GPU-aaaa", 43)
        t_end = time.monotonic() + 5
        while not mon.xids and time.monotonic() < t_end:
            time.sleep(0.02)
        rep = system_report(time.time() - 60, {4242}, deadline=time.monotonic() + 5)
        later = system_report(time.time() + 60, {4242}, deadline=time.monotonic() + 5)
    (g,) = rep["gpus"]
    assert (g["util_gpu_pct"], g["mem_used_mib"], g["mem_total_mib"], g["sm_mhz"]) == (100, 1024, 141 * 1024, 1980)
    assert [(p["pid"], p["in_run"]) for p in g["processes"]] == [(4242, True), (99, False)]
    assert [x["xid"] for x in rep["nvml_xids"]] == [43]
    assert later["nvml_xids"] == []  # listened, nothing since then
    text = "\n".join(describe_system(rep))
    assert "GPU 0 Fake H200; utilization 100% (memory 3%)" in text and "of this run: [4242]" in text
    assert "'xid': 43" in text


def test_without_nvml_or_a_monitor_it_says_so(monkeypatch):
    telemetry.use_nvml(None)
    monkeypatch.setattr(telemetry, "nvml", lambda: None)
    monkeypatch.setattr(telemetry, "nvml_unavailable_reason", lambda: "NVML Shared Library Not Found")
    rep = system_report(time.time(), set(), deadline=time.monotonic() + 5)
    assert rep["gpus"] == [] and rep["nvml"] == "NVML Shared Library Not Found"
    assert rep["nvml_xids"] == "no Xid watch was running"


def test_kernel_log_lines_since_the_run_began(tmp_path, monkeypatch):
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    fake = tmp_path / "dmesg"
    fake.write_text("#!/bin/sh\n"
                    f"echo '[{uptime - 1000:12.6f}] NVRM: Xid (PCI:0000:00:06): 31, pid=1, old fault'\n"
                    f"echo '[{uptime - 0.2:12.6f}] NVRM: Xid (PCI:0000:00:06): 43, pid=2, new'\n"
                    f"echo '[{uptime - 0.1:12.6f}] eth0: link up'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    lines = KernelLog(baseline=False).lines_since(time.time() - 5)
    assert len(lines) == 1 and "43, pid=2, new" in lines[0]


def test_an_unreadable_kernel_log_is_a_reason(tmp_path, monkeypatch):
    fake = tmp_path / "dmesg"
    fake.write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    rep = system_report(time.time(), set(), deadline=time.monotonic() + 5)
    assert rep["kernel_log_xids"] == "unreadable: dmesg: read kernel buffer failed: Operation not permitted"
