// deadlock_names.h -- phase and barrier ids of the deadlock family's kernels.
//
// One enumerator per line: stress/tripwire/names.py parses this file, so a hang diagnosis
// names ATTN_RELEASE instead of "barrier 3". Keep the ids below 4095 (phases) and 16383
// (barriers): that is what one tripwire word has room for.
#pragma once

enum DeadlockPhase {
  PHASE_GRID_WORK = 1,
  PHASE_GRID_SYNC = 2,
  PHASE_QKV = 3,
  PHASE_ATTN_CHUNK = 4,
  PHASE_ATTN_MERGE = 5,
  PHASE_WAIT_RELEASE = 6,
  PHASE_MOE_W13_W2 = 7,
  PHASE_LAYER_ENTRY = 8,
};

enum DeadlockBarrier {
  BAR_GRID = 1,
  BAR_CHUNK_MERGE = 2,
  BAR_ATTN_RELEASE = 3,
  BAR_MOE_W13_W2 = 4,
};
