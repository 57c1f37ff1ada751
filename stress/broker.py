"""The GPU broker: run any command on one exclusively leased GPU (`hazards lease -- CMD`).

1. Wait for a free GPU: an flock lease (hazards.engine.leases) that no one else holds and,
   with `exclusive`, no compute process of anyone else on the card (NVML).
2. Run the command with CUDA_VISIBLE_DEVICES set to that GPU (its UUID), its output going
   straight to ours (streamed, not captured), under a keeper (stress/reaper.py) that kills
   the command's whole tree if this process dies.
3. Release the lease on any exit. The flock is dropped by the kernel even when this process
   is SIGKILLed, and the keeper then kills the command, so a GPU is never left leased by a
   dead broker nor used by a command whose lease is gone. More in docs/campaigns.md.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from .errors import UserError
from .leases import GpuLease, acquire_free, lease_candidates
from .targets.base import check_argv

REAPER = Path(__file__).with_name("reaper.py")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
WAIT_NOTE_EVERY_S = 30.0


def wait_for_gpu(holder: str, *, wait_s: float | None, exclusive: bool = True, lock_dir: str | None = None,
                 poll_s: float = 1.0, note: Callable[[str], None] | None = None) -> GpuLease:
    """Lease one free GPU, waiting up to `wait_s` (None: forever); UserError when none came."""
    if not lease_candidates():
        raise UserError("no GPU is visible to this process (CUDA_VISIBLE_DEVICES, driver)")
    deadline = None if wait_s is None else time.monotonic() + wait_s
    next_note = 0.0
    while True:
        leases, skipped = acquire_free(holder, lock_dir=lock_dir, max_gpus=1, exclusive=exclusive)
        if leases:
            return leases[0]
        why = "; ".join(f"GPU {g}: {r}" for g, r in skipped.items())
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise UserError(f"no GPU became free within {wait_s:g}s ({why})")
        if note and now >= next_note:
            note(f"waiting for a free GPU ({why})")
            next_note = now + WAIT_NOTE_EVERY_S
        time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - now)))


def run_leased(argv: list[str], *, holder: str = "hazards lease", wait_s: float | None = None,
               exclusive: bool = True, lock_dir: str | None = None,
               note: Callable[[str], None] | None = None) -> int:
    """Lease a GPU, run `argv` on it under the keeper, give the GPU back; the exit status."""
    env = dict(os.environ)
    argv = check_argv(list(argv), None, env)
    lease = wait_for_gpu(holder, wait_s=wait_s, exclusive=exclusive, lock_dir=lock_dir, note=note)
    try:
        env.update(lease.env())
        env.update(HZ_LEASE_GPU=lease.gpu, HZ_LEASE_HOLDER=holder)
        if note:
            note(f"leased GPU {lease.gpu} ({lease.visible_devices}); running {argv[0]}")
        received: list[int] = []
        keeper: subprocess.Popen | None = None

        def forward(signum: int, frame: object) -> None:
            received.append(signum)
            if keeper is not None and keeper.poll() is None:
                keeper.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in FORWARDED}
        try:
            keeper = subprocess.Popen([sys.executable, str(REAPER), str(os.getpid()), "--", *argv], env=env)
            rc = keeper.wait()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        return rc
    finally:
        lease.release()
