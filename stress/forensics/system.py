"""The machine's side of a hang: the GPUs' state through NVML and the Xids since the run began.

Everything comes from the telemetry module (NVML readings, the kernel log, the Xid events
a running TelemetryMonitor received); this module only picks what a hang report needs
and says in words what it saw.
"""
from __future__ import annotations

import time
from typing import Any

from ..telemetry import KernelLog, gpu_states, xids_since


def system_report(started_at: float, run_pids: set[int], *, deadline: float) -> dict[str, Any]:
    """NVML state of every GPU (processes of this run marked), dmesg Xid lines since
    `started_at` (epoch), and the Xid events of any running telemetry monitor."""
    t0 = time.monotonic()
    gpus, why = gpu_states()
    for g in gpus:
        for p in g.get("processes", []):
            p["in_run"] = p["pid"] in run_pids
    log = KernelLog(baseline=False)
    left = deadline - time.monotonic()
    lines = log.lines_since(started_at, timeout_s=max(0.1, min(2.0, left))) if left > 0.2 else []
    kernel_log: Any = lines if log.readable else f"unreadable: {log.why}"
    if left <= 0.2:
        kernel_log = "not read: no time left in the hang budget"
    nvml_xids = xids_since(started_at)
    return {"gpus": gpus, "nvml": why or "ok", "kernel_log_xids": kernel_log,
            "nvml_xids": nvml_xids if nvml_xids is not None else "no Xid watch was running",
            "seconds": round(time.monotonic() - t0, 3)}


def describe_system(rep: dict[str, Any]) -> list[str]:
    """Lines for hang.md: one per GPU, then the Xids."""
    out = []
    if not rep.get("gpus"):
        out.append(f"NVML: {rep.get('nvml')}")
    for g in rep.get("gpus", []):
        procs = g.get("processes", [])
        mine = [p["pid"] for p in procs if p.get("in_run")]
        bits = [f"GPU {g.get('index')} {g.get('name', '?')}"]
        if "util_gpu_pct" in g:
            bits.append(f"utilization {g['util_gpu_pct']}% (memory {g['util_mem_pct']}%)")
        if "sm_mhz" in g:
            bits.append(f"SM {g['sm_mhz']} MHz, memory {g.get('mem_mhz', '?')} MHz")
        if "mem_used_mib" in g:
            bits.append(f"{g['mem_used_mib']} of {g['mem_total_mib']} MiB used")
        if "temp_c" in g:
            bits.append(f"{g['temp_c']} °C")
        if "power_w" in g:
            bits.append(f"{g['power_w']} W")
        if g.get("throttle"):
            bits.append("clocks limited by " + ", ".join(g["throttle"]))
        bits.append(f"{len(procs)} compute process(es)" + (f", of this run: {mine}" if mine else ""))
        out.append("; ".join(bits))
    kl = rep.get("kernel_log_xids")
    if isinstance(kl, list):
        out.append("kernel log since the run started: " + ("no Xid/NVRM line" if not kl else f"{len(kl)} line(s)"))
        out += [f"    {ln}" for ln in kl[-10:]]
    else:
        out.append(f"kernel log: {kl}")
    nx = rep.get("nvml_xids")
    out.append(f"NVML Xid events since the run started: {nx if isinstance(nx, str) else (nx or 'none')}")
    return out
