"""Synthetic tripwire snapshots of megakernel_layers hangs (what the kernel's waits publish)."""
from __future__ import annotations

from hazards.engine.tripwire.layout import Header, Slot, Snapshot

# the kernel's phases (megakernel_layers_names.h); its barriers: hazards.megakernel_layers.explain
PHASE_ATTN_CHUNK, PHASE_ATTN_MERGE, PHASE_OPROJ, PHASE_MOE_W2, PHASE_ROUTING_WAIT = 3, 4, 5, 8, 9
NO_FEEDER = (1 << 64) - 1


def slot(worker: int, *, layer: int, phase: int, barrier: int = 0, observed: int = 0, expected: int = 0,
         aux: tuple[int, int, int] = (NO_FEEDER, 0, NO_FEEDER), waiting: bool = True) -> Slot:
    return Slot(worker=worker, raw=(0,) * 16, current=True, written=True, phase=phase, layer=layer, tile=0,
                bar_current=waiting, bar_state=1 if waiting else 0, barrier=barrier, spins=4096,
                observed=observed, expected=expected, aux=aux, arrive=(), exit=())


def snapshot(workers: int, slots: list[Slot]) -> Snapshot:
    h = Header(0x57545A48, 1, 1, workers, 16, 7, 1, 0, 0, 1, 0, 1024, 32)
    return Snapshot("fake", 0.0, 128 + 128 * workers, h, slots)
