"""A fake NVML module (the subset of nvidia-ml-py that hazards.engine.telemetry and hazards.engine.leases use).

Tests drive it: `gpus[uuid]` holds each GPU's readings, `post_xid(uuid, xid)` queues an
Xid critical-error event, `ecc[uuid]` the volatile (corrected, uncorrected) totals,
`procs[uuid]` the compute pids NVML would list.
"""
import queue
import types

NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_VOLATILE_ECC = 0
nvmlEventTypeXidCriticalError = 8
nvmlClocksThrottleReasonGpuIdle = 0x1
nvmlClocksThrottleReasonSwPowerCap = 0x4
nvmlClocksThrottleReasonHwSlowdown = 0x8
nvmlClocksThrottleReasonAll = 0xF
nvmlClocksThrottleReasonNone = 0


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class FakeNvml(types.SimpleNamespace):
    """One fake NVML with per-test state (a module-like namespace)."""

    def __init__(self, uuids, *, xid_supported=True):
        super().__init__()
        for k, v in globals().items():
            if isinstance(v, int) or k.startswith("NVMLError"):  # the constants and error classes
                setattr(self, k, v)
        self.uuids = list(uuids)
        self.ecc = {u: [0, 0] for u in uuids}
        self.procs = {u: [] for u in uuids}
        self.readings = {u: {"sm": 1980, "mem": 2619, "temp": 40, "power_mw": 120000, "throttle": 0} for u in uuids}
        self.events = queue.Queue()
        self.xid_supported = xid_supported
        self.registered = set()

    def post_xid(self, uuid, xid):
        self.events.put(types.SimpleNamespace(device=uuid, eventData=xid, eventType=nvmlEventTypeXidCriticalError))

    # -- the NVML API subset -----------------------------------------------------------
    def nvmlInit(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "580.fake"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.readings:
            raise NVMLError("not found")
        return uuid

    def nvmlDeviceGetUUID(self, h):
        return h

    def nvmlDeviceGetName(self, h):
        return "Fake H200"

    def nvmlDeviceGetClockInfo(self, h, which):
        return self.readings[h]["sm" if which == NVML_CLOCK_SM else "mem"]

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.readings[h]["temp"]

    def nvmlDeviceGetPowerUsage(self, h):
        return self.readings[h]["power_mw"]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self.readings[h]["throttle"]

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self.ecc[h][kind]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=512 << 20) for p in self.procs[h]]

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.uuids[i]

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=100, memory=3)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=1 << 30, total=141 << 30, free=140 << 30)

    def nvmlEventSetCreate(self):
        return object()

    def nvmlDeviceRegisterEvents(self, h, kinds, evset):
        if not self.xid_supported:
            raise NVMLError_NotSupported("Not Supported")
        self.registered.add(h)

    def nvmlEventSetWait(self, evset, timeout_ms):
        try:
            return self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise NVMLError_Timeout("Timeout") from None

    def nvmlEventSetFree(self, evset):
        pass
