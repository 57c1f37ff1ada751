"""GPU telemetry through NVML (nvidia-ml-py): what the card was doing while a run ran.

Per run: GPU UUID, name, driver, SM/memory clocks, temperature, power, clock-throttle
reasons, ECC counter deltas over the run, and the Xid events received inside the run
window. A background thread per campaign waits on an NVML event set for Xid critical
errors (NVML events carry no time stamp: an event is stamped when it is received, within
the wait granularity) and samples the slow readings once a second, so a run costs only
the two ECC reads at its ends. More in docs/campaigns.md.
"""
from __future__ import annotations

import dataclasses
import re
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any

# Xids that an application can cause on its own (illegal access, its kernel killed, a
# graphics exception). Everything else (ECC, row remap, NVLink, fallen off the bus, GSP
# errors...) points at the card, its driver or the platform.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69})

_lock = threading.Lock()
_state: dict[str, Any] = {"module": None, "tried": False, "why": ""}
_monitors: "weakref.WeakSet[TelemetryMonitor]" = weakref.WeakSet()  # started, not yet stopped
_XID_LINE = re.compile(r"\bXid\b|NVRM:", re.IGNORECASE)
_DMESG_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]")


def use_nvml(module: Any | None) -> None:
    """Use `module` as NVML (tests pass a fake); None forgets it and retries the real one."""
    with _lock:
        _state.update(module=module, tried=module is not None, why="")


def nvml() -> Any | None:
    """The initialised NVML module, or None (see `nvml_unavailable_reason()`)."""
    with _lock:
        if _state["tried"]:
            return _state["module"]
        _state["tried"] = True
        try:
            import pynvml

            pynvml.nvmlInit()
            _state["module"] = pynvml
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, driver not loaded...
            _state["why"] = f"{type(e).__name__}: {e}"
        return _state["module"]


def nvml_unavailable_reason() -> str:
    """Why NVML could not be used ('' when it can)."""
    return "" if nvml() is not None else (_state["why"] or "NVML not available")


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _handle(nv: Any, uuid: str) -> Any | None:
    try:
        return nv.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:
        return None


def _try(fn: Any, *args: Any) -> Any | None:
    try:
        return fn(*args)
    except Exception:
        return None


def compute_pids(uuid: str) -> list[int]:
    """Pids of compute processes NVML sees on this GPU (empty when unknown)."""
    nv = nvml()
    h = _handle(nv, uuid) if nv else None
    procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, h) if h is not None else None
    return sorted({int(p.pid) for p in procs or ()})


def throttle_names(mask: int, nv: Any) -> list[str]:
    """Names of the clock-throttle reasons set in `mask` ('HwSlowdown', 'SwPowerCap', ...)."""
    prefix = "nvmlClocksThrottleReason"
    out = []
    for attr in dir(nv):
        if attr.startswith(prefix) and attr[len(prefix):] not in ("All", "None"):
            bit = getattr(nv, attr)
            if isinstance(bit, int) and bit and mask & bit == bit:
                out.append(attr[len(prefix):])
    return sorted(set(out))


def read_ecc(nv: Any, handle: Any) -> tuple[int, int] | None:
    """(corrected, uncorrected) volatile ECC totals, or None on a card without ECC."""
    c = _try(nv.nvmlDeviceGetTotalEccErrors, handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
    u = _try(nv.nvmlDeviceGetTotalEccErrors, handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
    return None if c is None or u is None else (int(c), int(u))


def read_gpu(nv: Any, handle: Any) -> dict[str, Any]:
    """The slow readings of one GPU now; readings the card does not support are omitted."""
    out: dict[str, Any] = {"t": time.time()}
    for key, fn, args in (
        ("name", nv.nvmlDeviceGetName, (handle,)),
        ("sm_mhz", nv.nvmlDeviceGetClockInfo, (handle, nv.NVML_CLOCK_SM)),
        ("mem_mhz", nv.nvmlDeviceGetClockInfo, (handle, nv.NVML_CLOCK_MEM)),
        ("temp_c", nv.nvmlDeviceGetTemperature, (handle, nv.NVML_TEMPERATURE_GPU)),
        ("power_mw", nv.nvmlDeviceGetPowerUsage, (handle,)),
    ):
        v = _try(fn, *args)
        if v is not None:
            out[key] = _s(v) if key == "name" else int(v)
    if "power_mw" in out:
        out["power_w"] = round(out.pop("power_mw") / 1000.0, 1)
    reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    mask = _try(reasons, handle) if reasons else None
    if mask is not None:
        out["throttle"] = throttle_names(int(mask), nv)
    return out


@dataclasses.dataclass
class RunWindow:
    """What `TelemetryMonitor.begin` hands back for `end`: the run's start and ECC then."""

    uuid: str | None
    t0: float
    ecc0: tuple[int, int] | None = None


@dataclasses.dataclass
class _Gpu:
    uuid: str
    handle: Any
    start_ecc: tuple[int, int] | None
    last: dict[str, Any] = dataclasses.field(default_factory=dict)
    samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class TelemetryMonitor:
    """Telemetry for the GPUs of one campaign: a sampler/Xid thread plus per-run windows.

    `begin(uuid)` at a run's start, `end(window)` at its end returns the run's telemetry
    dict (empty without NVML). `summary()` gives the per-GPU campaign table.
    """

    def __init__(self, uuids: list[str | None], *, sample_every_s: float = 1.0, max_samples: int = 20000) -> None:
        self.nv = nvml()
        self.sample_every_s = sample_every_s
        self.max_samples = max_samples
        self.driver = ""
        self.xids: list[dict[str, Any]] = []
        self.xid_watch = "off"
        self._gpus: dict[str, _Gpu] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._evset: Any = None
        self._mu = threading.Lock()
        if self.nv is None:
            self.xid_watch = f"unavailable: {nvml_unavailable_reason()}"
            return
        self.driver = _s(_try(self.nv.nvmlSystemGetDriverVersion) or "")
        for u in uuids:
            h = _handle(self.nv, u) if u else None
            if h is not None:
                self._gpus[u] = _Gpu(u, h, read_ecc(self.nv, h))

    def names(self) -> dict[str, str]:
        """{uuid: product name} of the watched GPUs NVML names."""
        out = {}
        for u, g in self._gpus.items():
            name = _try(self.nv.nvmlDeviceGetName, g.handle)
            if name is not None:
                out[u] = _s(name)
        return out

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "TelemetryMonitor":
        """Start the background thread (no-op without NVML or GPUs)."""
        if not self._gpus or self._thread is not None:
            return self
        self._register_xids()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="hz-telemetry", daemon=True)
        self._thread.start()
        _monitors.add(self)
        return self

    def stop(self) -> None:
        """Stop the thread and free the event set (idempotent)."""
        self._stop.set()
        _monitors.discard(self)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._evset is not None:
            _try(self.nv.nvmlEventSetFree, self._evset)
            self._evset = None

    def __enter__(self) -> "TelemetryMonitor":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _register_xids(self) -> None:
        nv = self.nv
        try:
            self._evset = nv.nvmlEventSetCreate()
            for g in self._gpus.values():
                nv.nvmlDeviceRegisterEvents(g.handle, nv.nvmlEventTypeXidCriticalError, self._evset)
            self.xid_watch = "on"
        except Exception as e:  # NotSupported / NoPermission (containers) / old driver
            self.xid_watch = f"unavailable: {type(e).__name__}: {e}"
            if self._evset is not None:
                _try(nv.nvmlEventSetFree, self._evset)
                self._evset = None

    def _loop(self) -> None:
        next_sample = time.monotonic() + self.sample_every_s
        while not self._stop.is_set():
            if self._evset is not None:
                self._wait_event(min(200, max(1, int(self.sample_every_s * 1000))))
            else:
                self._stop.wait(self.sample_every_s)
            if time.monotonic() >= next_sample:
                self._sample()
                next_sample = time.monotonic() + self.sample_every_s

    def _wait_event(self, timeout_ms: int) -> None:
        nv = self.nv
        try:
            data = nv.nvmlEventSetWait(self._evset, timeout_ms)
        except Exception as e:
            if type(e).__name__ != "NVMLError_Timeout":
                self._stop.wait(timeout_ms / 1000.0)  # a broken event set must not spin
            return
        uuid = _s(_try(nv.nvmlDeviceGetUUID, data.device) or "")
        with self._mu:
            self.xids.append({"t": time.time(), "uuid": uuid, "xid": int(data.eventData),
                              "application": int(data.eventData) in APPLICATION_XIDS})

    def _sample(self) -> None:
        for g in self._gpus.values():
            reading = read_gpu(self.nv, g.handle)
            with self._mu:
                g.last = reading
                if len(g.samples) < self.max_samples:
                    g.samples.append(reading)

    # -- per run ---------------------------------------------------------------------------
    def begin(self, uuid: str | None) -> RunWindow:
        """Mark a run's start on GPU `uuid`."""
        g = self._gpus.get(uuid or "")
        return RunWindow(uuid, time.time(), read_ecc(self.nv, g.handle) if g else None)

    def end(self, window: RunWindow, *, slack_s: float = 0.5) -> dict[str, Any]:
        """The run's telemetry: latest readings, ECC deltas and Xids inside its window."""
        g = self._gpus.get(window.uuid or "")
        if g is None:
            return {}
        t1 = time.time()
        with self._mu:
            out: dict[str, Any] = {"uuid": g.uuid, "driver": self.driver}
            out.update({k: v for k, v in g.last.items() if k != "t"})
            out["xids"] = [x["xid"] for x in self.xids
                           if x["uuid"] == g.uuid and window.t0 - slack_s <= x["t"] <= t1 + slack_s]
        ecc1 = read_ecc(self.nv, g.handle)
        if window.ecc0 is not None and ecc1 is not None:
            out["ecc_corrected"] = ecc1[0] - window.ecc0[0]
            out["ecc_uncorrected"] = ecc1[1] - window.ecc0[1]
        return out

    # -- per campaign ----------------------------------------------------------------------
    def summary(self) -> dict[str, dict[str, Any]]:
        """{uuid: campaign-wide telemetry}: ranges, throttle reasons seen, ECC delta, Xids."""
        out: dict[str, dict[str, Any]] = {}
        with self._mu:
            for g in self._gpus.values():
                row = summarize_samples(g.samples)
                row.update(driver=self.driver, xid_watch=self.xid_watch,
                           xids=[x for x in self.xids if x["uuid"] == g.uuid])
                now = read_ecc(self.nv, g.handle)
                if g.start_ecc is not None and now is not None:
                    row["ecc_corrected"] = now[0] - g.start_ecc[0]
                    row["ecc_uncorrected"] = now[1] - g.start_ecc[1]
                out[g.uuid] = row
        return out


def xids_since(t0: float) -> list[dict[str, Any]] | None:
    """Xid events every running TelemetryMonitor received at or after epoch `t0`.

    None when no monitor with an Xid watch is running (nobody was listening), which is
    not the same as an empty list (listened, nothing came).
    """
    watching = [m for m in list(_monitors) if m.xid_watch == "on"]
    if not watching:
        return None
    out: list[dict[str, Any]] = []
    for m in watching:
        with m._mu:
            out += [dict(x) for x in m.xids if x["t"] >= t0]
    return sorted(out, key=lambda x: x["t"])


def read_gpu_state(nv: Any, handle: Any) -> dict[str, Any]:
    """`read_gpu` plus what a hang report needs: utilization, memory and compute processes."""
    out = read_gpu(nv, handle)
    util = _try(getattr(nv, "nvmlDeviceGetUtilizationRates", None), handle)
    if util is not None:
        out["util_gpu_pct"], out["util_mem_pct"] = int(util.gpu), int(util.memory)
    mem = _try(getattr(nv, "nvmlDeviceGetMemoryInfo", None), handle)
    if mem is not None:
        out["mem_used_mib"], out["mem_total_mib"] = int(mem.used) >> 20, int(mem.total) >> 20
    procs = _try(getattr(nv, "nvmlDeviceGetComputeRunningProcesses", None), handle)
    if procs is not None:
        used = [getattr(p, "usedGpuMemory", None) for p in procs]
        out["processes"] = [{"pid": int(p.pid), "used_mib": (u >> 20) if isinstance(u, int) else None}
                            for p, u in zip(procs, used)]
    uuid = _try(getattr(nv, "nvmlDeviceGetUUID", None), handle)
    if uuid is not None:
        out["uuid"] = _s(uuid)
    return out


def gpu_states() -> tuple[list[dict[str, Any]], str]:
    """`read_gpu_state` of every GPU NVML sees now, and '' or why there are none."""
    nv = nvml()
    if nv is None:
        return [], nvml_unavailable_reason()
    n = _try(getattr(nv, "nvmlDeviceGetCount", None))
    if not n:
        return [], "NVML sees no GPU"
    states = []
    for i in range(int(n)):
        h = _try(getattr(nv, "nvmlDeviceGetHandleByIndex", None), i)
        if h is not None:
            states.append({"index": i, **read_gpu_state(nv, h)})
    return states, ""


class KernelLog:
    """Xid/NVRM lines of the kernel log (`dmesg`), when it is readable.

    `new_lines()` gives the lines that appeared since the previous call (or since this
    object was made); `lines_since(t0)` those stamped at or after epoch `t0`.
    """

    def __init__(self, baseline: bool = True) -> None:
        self.readable, self.why = True, ""
        self._seen = set(self._lines()) if baseline else set()

    def _lines(self, timeout_s: float = 5.0) -> list[str]:
        if not self.readable:
            return []
        try:
            r = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.readable, self.why = False, f"dmesg not runnable: {e}"
            return []
        if r.returncode != 0:
            self.readable, self.why = False, (r.stderr.strip().splitlines() or ["dmesg failed"])[0]
            return []
        return [line for line in r.stdout.splitlines() if _XID_LINE.search(line)]

    def new_lines(self) -> list[str]:
        """Xid/NVRM lines not seen before this call (and remembers them)."""
        fresh = [line for line in self._lines() if line not in self._seen]
        self._seen.update(fresh)
        return fresh

    def lines_since(self, t0: float, *, slack_s: float = 1.0, timeout_s: float = 5.0) -> list[str]:
        """Xid/NVRM lines whose `[seconds since boot]` stamp falls at or after epoch `t0`
        (less `slack_s`); unstamped lines are kept (their time is unknown)."""
        try:
            boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            boot = None
        out = []
        for line in self._lines(timeout_s):
            m = _DMESG_STAMP.match(line)
            if m is None or boot is None or boot + float(m.group(1)) >= t0 - slack_s:
                out.append(line)
        return out


def summarize_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Ranges of the sampled readings (min/max clocks, max temperature and power)."""
    row: dict[str, Any] = {"samples": len(samples)}
    names = [s["name"] for s in samples if "name" in s]
    if names:
        row["name"] = names[-1]
    for key, aggs in (("sm_mhz", (min, max)), ("mem_mhz", (min, max)), ("temp_c", (max,)), ("power_w", (max,))):
        vals = [s[key] for s in samples if key in s]
        for agg in aggs:
            if vals:
                row[f"{key}_{agg.__name__}"] = agg(vals)
    row["throttle"] = sorted({r for s in samples for r in s.get("throttle", ())})
    return row


def hardware_suspect(per_gpu: dict[str, dict[str, Any]]) -> str | None:
    """A hint when failures are confined to one GPU that also shows hardware trouble.

    `per_gpu` maps a UUID to {"runs", "failures", "xids": [ints], "ecc_corrected",
    "ecc_uncorrected"}. Fires only when at least two GPUs ran, every failure is on one of
    them, and that one logged a non-application Xid or an ECC delta.
    """
    ran = {u: d for u, d in per_gpu.items() if d.get("runs", 0) > 0}
    failing = [u for u, d in ran.items() if d.get("failures", 0) > 0]
    if len(ran) < 2 or len(failing) != 1:
        return None
    u = failing[0]
    d = ran[u]
    bad_xids = sorted({x for x in d.get("xids", ()) if x not in APPLICATION_XIDS})
    ecc = int(d.get("ecc_corrected") or 0) + int(d.get("ecc_uncorrected") or 0)
    if not bad_xids and ecc <= 0:
        return None
    why = []
    if bad_xids:
        why.append("Xid " + ", ".join(map(str, bad_xids)))
    if ecc > 0:
        why.append(f"ECC errors +{ecc}")
    others = len(ran) - 1
    return (f"hardware-suspect: all {d['failures']} failures are on {u} (none on the other "
            f"{others} GPU{'s' if others > 1 else ''}), which also logged {' and '.join(why)}; "
            f"rerun on another card before blaming the kernel")
