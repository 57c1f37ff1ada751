// pace.h -- how far a family's launch loop may run ahead of the GPU (docs/stall.md).
//
// The heartbeat (harness_main.h) records an event at the tail of the batch's stream and
// reports it when it completes: every launch enqueued before it must finish first. A loop
// that enqueued a whole batch at once would beat once per batch, and a batch longer than the
// stall window would be a false hang. `Batch::launched()` (harness.h), called once after
// each launch, records an event into a ring of kQueueDepth slots and, before reusing a slot,
// waits for the launch that slot marked: at most kQueueDepth launches are ever queued. Only
// the host's pacing changes: the same kernels run in the same order on the same stream.
// No CUDA here, so tests/families/test_launch_pacing.py runs the ring on the CPU.
#pragma once

namespace hz {

// Depth 32, from the per-launch times the false-stall round measured under GPU contention
// and CPU load (docs/results/hangs-h200/falsestall/falsestall.jsonl, seconds / launches,
// the launch's check kernel included): pipeline 0.055-0.08 ms, mma_pingpong 0.16-0.21 ms,
// ordering 0.1-0.5 ms (pc_fixed), barrier_layout 0.7-0.9 ms.
// - The GPU stays fed: enqueueing one launch (its kernels + one event record, a few us) is
//   far cheaper than the shortest launch, and 32 queued launches of the shortest family are
//   ~1.8 ms of work, more than a host thread's usual scheduling hiccup under CPU load.
// - The heartbeat keeps its interval: its tail event waits for at most 32 launches, i.e.
//   <= 32 x 0.9 ms ~ 30 ms for the slowest family, so a beat comes within ~130 ms (the
//   100 ms interval + the queue), far inside the 1.0 s stall floor (stress/stall.py).
constexpr int kQueueDepth = 32;

// Launch `n` (0-based, counted from the batch's start) marks its completion in slot
// n % depth. Before that, the slot's previous mark - launch n - depth - must have completed
// (`wait`), so after the call at most `depth` launches are queued: n - depth + 1 .. n.
// Every launch of a batch passes here once, in order; a new batch starts at n = 0 with every
// earlier event complete (run_batch synchronizes its stream at the end of a batch).
template <class Event, class Wait, class Record>
void pace_launch(Event* ring, int depth, long n, Wait&& wait, Record&& record) {
  Event& slot = ring[n % depth];
  if (n >= depth) wait(slot);
  record(slot);
}

}  // namespace hz
