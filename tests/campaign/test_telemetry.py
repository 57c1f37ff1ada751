"""Telemetry: readings, ECC deltas and Xids inside a run window, the hardware-suspect hint,
and graceful degradation without NVML."""
from __future__ import annotations

import time

from hazards.engine import telemetry
from hazards.engine.telemetry import TelemetryMonitor, hardware_suspect


def _wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_run_window_reports_readings_ecc_delta_and_xids_inside_it(fake_nvml):
    fake_nvml.readings["GPU-aaaa"].update(temp=71, throttle=0x8 | 0x4)
    with TelemetryMonitor(["GPU-aaaa", "GPU-bbbb"], sample_every_s=0.05) as mon:
        fake_nvml.post_xid("GPU-aaaa", 31)  # before the run: outside its window
        assert _wait_for(lambda: len(mon.xids) == 1)
        time.sleep(0.7)
        w = mon.begin("GPU-aaaa")
        fake_nvml.ecc["GPU-aaaa"][0] += 3
        fake_nvml.ecc["GPU-aaaa"][1] += 1
        fake_nvml.post_xid("GPU-aaaa", 48)
        fake_nvml.post_xid("GPU-bbbb", 79)  # another GPU: not this run's
        assert _wait_for(lambda: len(mon.xids) == 3)
        tel = mon.end(w, slack_s=0.1)
        summary = mon.summary()
    assert tel["uuid"] == "GPU-aaaa" and tel["driver"] == "580.fake" and tel["name"] == "Fake H200"
    assert tel["temp_c"] == 71 and tel["sm_mhz"] == 1980 and tel["power_w"] == 120.0
    assert tel["throttle"] == ["HwSlowdown", "SwPowerCap"]
    assert tel["ecc_corrected"] == 3 and tel["ecc_uncorrected"] == 1
    assert tel["xids"] == [48]
    a = summary["GPU-aaaa"]
    assert a["xid_watch"] == "on" and [x["xid"] for x in a["xids"]] == [31, 48]
    assert a["ecc_corrected"] == 3 and a["temp_c_max"] == 71 and a["samples"] >= 2
    assert [x["xid"] for x in summary["GPU-bbbb"]["xids"]] == [79]


def test_xid_registration_refused_degrades_to_a_note(fake_nvml):
    fake_nvml.xid_supported = False
    with TelemetryMonitor(["GPU-aaaa"], sample_every_s=0.05) as mon:
        w = mon.begin("GPU-aaaa")
        tel = mon.end(w)
    assert mon.xid_watch.startswith("unavailable: NVMLError_NotSupported")
    assert tel["uuid"] == "GPU-aaaa" and tel["xids"] == []


def test_without_nvml_everything_is_empty_and_nothing_runs():
    telemetry.use_nvml(None)
    telemetry._state.update(tried=True, module=None, why="NVMLError_LibraryNotFound: no driver")
    try:
        mon = TelemetryMonitor(["GPU-x", None]).start()
        assert mon._thread is None
        assert mon.end(mon.begin("GPU-x")) == {} and mon.summary() == {}
        assert "no driver" in mon.xid_watch
        assert telemetry.compute_pids("GPU-x") == []
        mon.stop()
    finally:
        telemetry.use_nvml(None)


def test_hardware_suspect_needs_confined_failures_and_hardware_evidence():
    bad = {"runs": 50, "failures": 4, "xids": [48], "ecc_corrected": 0, "ecc_uncorrected": 0}
    good = {"runs": 50, "failures": 0, "xids": []}
    hint = hardware_suspect({"GPU-a": bad, "GPU-b": good})
    assert hint and hint.startswith("hardware-suspect") and "GPU-a" in hint and "Xid 48" in hint
    # an application Xid (31: MMU fault from an illegal access) is the kernel's doing
    assert hardware_suspect({"GPU-a": {**bad, "xids": [31]}, "GPU-b": good}) is None
    # ECC errors count as hardware evidence
    assert "ECC" in hardware_suspect({"GPU-a": {**bad, "xids": [], "ecc_corrected": 2}, "GPU-b": good})
    # failures on both GPUs: not confined
    assert hardware_suspect({"GPU-a": bad, "GPU-b": {**good, "failures": 1}}) is None
    # one GPU alone cannot show confinement
    assert hardware_suspect({"GPU-a": bad}) is None
