"""Which GPUs exist, from NVML or nvidia-smi, without ever initialising CUDA here."""
from __future__ import annotations

import os
import shutil
import subprocess


def _nvml_uuids() -> list[str] | None:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append(u.decode() if isinstance(u, bytes) else u)
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _smi_uuids() -> list[str] | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        r = subprocess.run([smi, "--query-gpu=uuid", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def all_gpu_uuids() -> list[str]:
    """UUIDs of every NVIDIA GPU on this host in NVML order (empty without a driver)."""
    uuids = _nvml_uuids()
    if uuids is None:
        uuids = _smi_uuids()
    return uuids or []


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (index or UUID).

    Honours the caller's CUDA_VISIBLE_DEVICES: an empty value means no GPU; otherwise its
    entries are returned as given, filtered to devices that exist when they are indices.
    """
    uuids = all_gpu_uuids()
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return [str(i) for i in range(len(uuids))]
    entries = [e.strip() for e in cvd.split(",") if e.strip()]
    out = []
    for e in entries:
        if e.isdigit():
            if int(e) < len(uuids):
                out.append(e)
        elif e.startswith(("GPU-", "MIG-")) and (not uuids or any(u.startswith(e) for u in uuids)):
            out.append(e)
        else:
            break  # CUDA stops enumerating at the first invalid entry
    return out


def gpu_available() -> bool:
    """True when at least one NVIDIA GPU is usable by children of this process."""
    return bool(visible_gpus())


def uuid_of(entry: str) -> str | None:
    """The UUID for a CUDA_VISIBLE_DEVICES entry (index or UUID prefix), if known."""
    uuids = all_gpu_uuids()
    if entry.isdigit():
        i = int(entry)
        return uuids[i] if i < len(uuids) else None
    return next((u for u in uuids if u.startswith(entry)), None)
