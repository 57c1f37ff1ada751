// megakernel_layers_names.h -- phase (task kind) and barrier ids of the layered MoE decode
// megakernel.
//
// One enumerator per line: stress/tripwire/names.py parses this file, so a hang diagnosis
// names ATTN_RELEASE instead of "barrier 4". The phase ids are also the numeric task ids
// the per-task profiler keys on (one id per task kind: QKV, attention chunk, merge, O-proj,
// router/top-k, expert W13, expert W2); the wait phases and layer marks only label
// breadcrumbs. Keep phases below 4095 and barriers below 16383 (one tripwire word).
#pragma once

enum MklPhase {
  PHASE_LAYER_ENTRY = 1,
  PHASE_QKV = 2,
  PHASE_ATTN_CHUNK = 3,
  PHASE_ATTN_MERGE = 4,
  PHASE_OPROJ = 5,
  PHASE_ROUTER_TOPK = 6,
  PHASE_MOE_W13 = 7,
  PHASE_MOE_W2 = 8,
  PHASE_ROUTING_WAIT = 9,
  PHASE_LAYER_END = 10,
};

enum MklBarrier {
  BAR_LAYER_END = 1,
  BAR_QKV_EPOCH = 2,
  BAR_CHUNK_MERGE = 3,
  BAR_ATTN_RELEASE = 4,
  BAR_OPROJ = 5,
  BAR_ROUTING = 6,
  BAR_W13_W2 = 7,
};

// The task kinds, by numeric id (the profiler's key; never reuse an id for another kind).
// TASK_WORKER is a block's whole lifetime in the launch (no phase has its id).
enum MklTask {
  TASK_QKV = 2,
  TASK_ATTN_CHUNK = 3,
  TASK_ATTN_MERGE = 4,
  TASK_OPROJ = 5,
  TASK_ROUTER_TOPK = 6,
  TASK_MOE_W13 = 7,
  TASK_MOE_W2 = 8,
  TASK_WORKER = 11,
};
// Their names, exported once (the profiled binary prints them; Python keeps no second list).
#define MKL_TASK_NAMES "2=qkv,3=attn_chunk,4=attn_merge,5=oproj,6=router_topk,7=moe_w13,8=moe_w2,11=worker"
