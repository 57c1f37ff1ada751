"""Python side of the ragged-decode megakernel: the ragged-decode contract over a ctypes library.

    handle = build_sched(weights, kv_cache, cfg, max_seq_len)   # untimed: buffers, counters
    out = ragged_decode(handle, q, starts, lens)                # one kernel launch
    teardown(handle)
More in docs/megakernel.md.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hazards.ragged_decode import schedule as sched
from hazards.engine import profiler
from hazards.engine.errors import UserError
from hazards.ragged_decode.build import build_library

SCHEDULES = ("guided", "split", "per_request")
PROBES = {"none": 0, "stream_only": 1, "compute_only": 2}  # diagnostics: results are garbage
ERROR_BITS = {1: "a request's starts/lens lie outside the arena (its output is NaN)",
              2: "the split schedule needs more partial slots than were allocated (output NaN)"}
ERROR_WORD = 2  # counters[ERROR_WORD]: the ERROR_BITS the kernel raised so far (CTR_ERROR, layout.cuh)


@functools.lru_cache(maxsize=None)
def load_library(path: Path | None = None) -> ctypes.CDLL:
    """Build (if needed) and load the library; declare the C signatures."""
    lib = ctypes.CDLL(str(path or build_library()))
    lib.hz_rd_set_profiler.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    lib.hz_rd_set_profiler.restype = None
    lib.hz_rd_set_stall.argtypes = [ctypes.c_int]
    lib.hz_rd_set_stall.restype = None
    lib.hz_rd_profiler_compiled.restype = ctypes.c_int
    lib.hz_rd_task_names.restype = ctypes.c_char_p
    c_int, c_ll, c_p = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
    lib.hz_rd_launch.argtypes = [c_p] * 9 + [c_ll] + [c_int] * 11 + [c_p]
    lib.hz_rd_launch.restype = c_int
    lib.hz_rd_occupancy.argtypes = [c_int, c_int, c_int, ctypes.POINTER(c_int), ctypes.POINTER(c_int)]
    lib.hz_rd_occupancy.restype = c_int
    lib.hz_rd_error_string.argtypes = [c_int]
    lib.hz_rd_error_string.restype = ctypes.c_char_p
    lib.hz_rd_smem_bytes.argtypes = [c_int, c_int, c_int]
    lib.hz_rd_smem_bytes.restype = ctypes.c_size_t
    lib.hz_rd_graph_node_counts.argtypes = [c_p, ctypes.POINTER(c_int), ctypes.POINTER(c_int)]
    lib.hz_rd_graph_node_counts.restype = c_int
    for name in ("hz_rd_head_dim", "hz_rd_max_kv_heads", "hz_rd_threads", "hz_rd_counter_words"):
        getattr(lib, name).restype = c_int
    lib.hz_rd_counter_words.argtypes = [c_int]
    return lib


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what}: CUDA error {code}: {lib.hz_rd_error_string(code).decode()}")


@dataclass
class Handle:
    """Everything one configuration needs per call; opaque to callers."""

    lib: Any
    k: torch.Tensor
    v: torch.Tensor
    B: int
    n_q: int
    n_kv: int
    hd: int
    schedule: str
    tile: int
    phases: int
    phase_chunks: int
    grid: int
    n_slots: int
    pacc: torch.Tensor
    pml: torch.Tensor
    counters: torch.Tensor
    probe: int = 0
    contiguous: int = 0
    stall_cycles: int = 0
    prof_records: torch.Tensor | None = None  # (capacity * 4,) int64 when profiling
    prof_claimed: torch.Tensor | None = None  # (1,) int64 when profiling

    @property
    def launch_schedule(self) -> int:
        return sched.GUIDED if self.schedule == "guided" else sched.SPLIT


def build_sched(weights: dict, kv_cache: dict, cfg: dict, max_seq_len: int, *,
                schedule: str = "split", split_tokens: int = 2048, phases: int = 6,
                grid: int | None = None, probe: str = "none", copies: str = "contiguous",
                profile: bool = False, ring_capacity: int = 4096, stall_cycles: int = 0,
                defines: tuple[str, ...] = ()) -> Handle:
    """Allocate partial buffers and counters for `cfg`; choose the schedule (untimed).

    schedule: "split" (default: every request cut on the device into `split_tokens`-token
    tiles, longest request first, tiles handed out by an atomic counter), "guided"
    (geometrically shrinking chunks of the whole line, `phases` phases), or "per_request"
    (one block per request: the naive baseline). On the H200 split/2048 measured fastest.
    `weights` and `max_seq_len` are ignored, as the ragged-decode contract says. `grid`
    overrides the persistent grid (default: every SM); `probe` ("stream_only",
    "compute_only") is a diagnostic that skips half the work.
    `copies`: "contiguous" (default: one bulk copy per 16-token stage and tensor, reads
    de-conflicted in registers) or "rows" (one bulk copy per token row into padded rows;
    measured 3x slower per SM on the H200, kept for comparison).
    `profile`: use the -DHZ_PROFILER build with a ring of `ring_capacity` spans.
    `stall_cycles` (a perf-gate candidate knob, 0 in production) idles the consumers per
    stage; `defines` builds and uses a library with extra -D flags (a candidate build).
    """
    del weights, max_seq_len
    if schedule not in SCHEDULES:
        raise UserError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    k, v = kv_cache.get("k"), kv_cache.get("v")
    if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
        raise UserError("kv_cache must hold tensors 'k' and 'v'")
    if ring_capacity < 1 or stall_cycles < 0:
        raise UserError(f"ring_capacity must be >= 1 and stall_cycles >= 0 "
                        f"(got {ring_capacity}, {stall_cycles})")
    lib = load_library(build_library(profiler=profile, defines=tuple(defines)))
    n_q, n_kv, hd, lens = int(cfg["n_q"]), int(cfg["n_kv"]), int(cfg["hd"]), list(cfg["lens"])
    if not (k.is_cuda and v.is_cuda and k.dtype == v.dtype == torch.bfloat16 and k.shape == v.shape
            and k.is_contiguous() and v.is_contiguous() and k.dim() == 3 and k.shape[1:] == (n_kv, hd)):
        raise UserError(f"kv_cache k/v must be contiguous bf16 CUDA tensors of shape (T, {n_kv}, {hd}) "
                        f"(got {tuple(k.shape)} {k.dtype} on {k.device})")
    if hd != lib.hz_rd_head_dim() or n_kv > lib.hz_rd_max_kv_heads() or n_q % n_kv or n_q // n_kv > 8:
        raise UserError(f"the kernel supports hd={lib.hz_rd_head_dim()}, n_kv <= {lib.hz_rd_max_kv_heads()}, "
                        f"n_q a multiple of n_kv with group <= 8 (got n_q={n_q}, n_kv={n_kv}, hd={hd})")
    if n_kv * ((n_q // n_kv + 1) // 2) > 16:
        raise UserError(f"the merge holds n_kv * ceil(group/2) <= 16 (got n_q={n_q}, n_kv={n_kv})")
    if not 1 <= phases <= 16 or split_tokens < 1 or probe not in PROBES or copies not in ("rows", "contiguous"):
        raise UserError(f"phases must be in 1..16, split_tokens >= 1, probe one of {', '.join(PROBES)}, "
                        "copies 'rows' or 'contiguous'")
    B = len(lens)
    per_sm, sms = ctypes.c_int(0), ctypes.c_int(0)
    with torch.cuda.device(k.device):
        _check(lib, lib.hz_rd_occupancy(B, n_q, n_kv, ctypes.byref(per_sm), ctypes.byref(sms)), "occupancy")
    if per_sm.value < 1:
        raise UserError(f"the kernel does not fit on this GPU ({lib.hz_rd_smem_bytes(B, n_q, n_kv)} bytes "
                        f"of shared memory per block for B={B})")
    grid = grid or per_sm.value * sms.value
    tile = 0 if schedule == "per_request" else split_tokens
    phase_chunks = grid
    kind = sched.GUIDED if schedule == "guided" else sched.SPLIT
    n_slots = sched.slot_capacity(lens, kind, tile, phases, phase_chunks)
    tq = (n_q // n_kv + 1) // 2
    dev = k.device
    return Handle(lib=lib, k=k, v=v, B=B, n_q=n_q, n_kv=n_kv, hd=hd, schedule=schedule, tile=tile,
                  phases=phases, phase_chunks=phase_chunks, grid=grid, n_slots=n_slots,
                  pacc=torch.empty(n_slots * n_kv * 8 * tq * 32, dtype=torch.float32, device=dev),
                  pml=torch.empty(n_slots * n_q * 2, dtype=torch.float32, device=dev),
                  counters=torch.zeros(lib.hz_rd_counter_words(B), dtype=torch.int32, device=dev),
                  probe=PROBES[probe], contiguous=int(copies == "contiguous"), stall_cycles=stall_cycles,
                  prof_records=(torch.zeros(ring_capacity * profiler.RECORD_WORDS, dtype=torch.int64, device=dev)
                                if profile else None),
                  prof_claimed=torch.zeros(1, dtype=torch.int64, device=dev) if profile else None)


def ragged_decode(handle: Handle, q: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, *,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention per request over its own arena slice: (B, n_q*hd) fp32, one launch.

    `out` (optional, (B, n_q*hd) fp32 contiguous) is written in place; tests poison it.
    """
    h = handle
    if q.shape != (h.B, h.n_q, h.hd) or q.dtype != torch.bfloat16 or not q.is_contiguous() or q.device != h.k.device:
        raise UserError(f"q must be contiguous bf16 ({h.B}, {h.n_q}, {h.hd}) on {h.k.device}")
    for name, t in (("starts", starts), ("lens", lens)):
        if t.shape != (h.B,) or t.dtype != torch.int32 or not t.is_contiguous() or t.device != h.k.device:
            raise UserError(f"{name} must be contiguous int32 ({h.B},) on {h.k.device}")
    if out is None:
        out = torch.empty(h.B, h.n_q * h.hd, dtype=torch.float32, device=h.k.device)
    elif out.shape != (h.B, h.n_q * h.hd) or out.dtype != torch.float32 or not out.is_contiguous():
        raise UserError(f"out must be contiguous fp32 ({h.B}, {h.n_q * h.hd})")
    stream = torch.cuda.current_stream(h.k.device).cuda_stream
    if h.prof_records is not None:
        h.prof_claimed.zero_()
        h.lib.hz_rd_set_profiler(h.prof_records.data_ptr(), h.prof_claimed.data_ptr(),
                                 h.prof_records.numel() // profiler.RECORD_WORDS)
    else:
        h.lib.hz_rd_set_profiler(None, None, 0)
    h.lib.hz_rd_set_stall(h.stall_cycles)
    code = h.lib.hz_rd_launch(q.data_ptr(), h.k.data_ptr(), h.v.data_ptr(), starts.data_ptr(), lens.data_ptr(),
                              out.data_ptr(), h.pacc.data_ptr(), h.pml.data_ptr(), h.counters.data_ptr(),
                              h.k.shape[0], h.B, h.n_q, h.n_kv, h.launch_schedule, h.tile, h.phases,
                              h.phase_chunks, h.n_slots, h.grid, h.probe, h.contiguous, stream)
    _check(h.lib, code, "ragged_decode launch")
    return out


def task_names(handle: Handle) -> dict[int, str]:
    """Profiler task id -> name, as the library states them (the Task enum in layout.cuh)."""
    out = {}
    for item in handle.lib.hz_rd_task_names().decode().split(","):
        num, name = item.split("=", 1)
        out[int(num)] = name
    return out


def read_profile(handle: Handle) -> profiler.Profile:
    """Decode the ring of the last call (synchronises). UserError without `profile=True`."""
    if handle.prof_records is None or not handle.lib.hz_rd_profiler_compiled():
        raise UserError("this handle was not built with profile=True: no per-task spans recorded")
    claimed = int(handle.prof_claimed.item())
    raw = handle.prof_records.cpu().numpy().tobytes()
    return profiler.decode(raw, claimed, names=task_names(handle))


def error_word(handle: Handle) -> torch.Tensor:
    """The ERROR_BITS the kernel raised so far, as a 0-d tensor on the device (no
    synchronisation: read it back with the output, `flag_messages` says what it holds)."""
    return handle.counters[ERROR_WORD]


def error_flags(handle: Handle) -> list[str]:
    """What the kernel flagged so far (synchronises; for tests and diagnostics, not the hot path)."""
    return flag_messages(int(error_word(handle).item()))


def flag_messages(bits: int) -> list[str]:
    """The ERROR_BITS set in `bits`, as sentences."""
    return [msg for bit, msg in ERROR_BITS.items() if bits & bit]


def graph_node_counts(handle: Handle, graph: torch.cuda.CUDAGraph) -> tuple[int, int]:
    """(kernel nodes, all nodes) of a captured torch CUDA graph (needs keep_graph=True)."""
    kernels, total = ctypes.c_int(0), ctypes.c_int(0)
    _check(handle.lib, handle.lib.hz_rd_graph_node_counts(ctypes.c_void_p(graph.raw_cuda_graph()),
                                                          ctypes.byref(kernels), ctypes.byref(total)),
           "cudaGraphGetNodes")
    return kernels.value, total.value


def teardown(handle: Handle) -> None:
    """Drop the handle's device buffers (the library stays loaded for later handles)."""
    for name in ("pacc", "pml", "counters", "k", "v", "prof_records", "prof_claimed"):
        setattr(handle, name, None)
