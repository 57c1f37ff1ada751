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

// Sub-spans (a profiled build with -DMKL_PROF_SUBSPANS=1; hz_profiler.h HZ_PROF_SUB_TASK): the
// time points thread 0 stamps inside a task instance. Sub-span k of a task runs from its
// previous reached point (0: the origin) to point k, and the last one (k = points + 1) ends
// at the task's record. Point indices are per task kind; SUB_GEMV is where gemv_block's
// rounds end (before the last reduction and emit) in every GEMV task. A point an instance
// does not reach (a later QKV tile's wait and norm) leaves no sub-span.
enum MklSubPoint {
  SUB_ORIGIN = 0,        // qkv: the tile's start; attn_chunk, attn_merge, oproj, moe_w2: before the wait;
                         // moe_w13: before the routing wait (first tile) or the tile's start; router_topk: its start
  SUB_WAIT = 1,          // the wait passed (the task span's begin); router_topk: its acquire fence
  SUB_FILL = 2,          // qkv: RMSNorm; attn_chunk: q copied; oproj: attn_out copied; moe_w13: hn copied;
                         // moe_w2: quantized; attn_merge: thread 0's warp merged; router_topk: partials summed
  SUB_GEMV = 3,          // GEMV tasks: the rounds done; attn_chunk: thread 0's warp's block loop done;
                         // router_topk: the hn payload written (a block barrier)
  SUB_AFTER = 4,         // attn_chunk: every warp's loop (the block barrier before the combine); oproj: its
                         // rows emitted (router partials next); router_topk: top-k done (thread 0's warp);
                         // moe_w13: its SwiGLU outputs stored (gemv_block's last barrier passed)
  SUB_COMBINE = 5,       // attn_chunk: thread 0's share of the combine and the partial write; moe_w13: the
                         // arrival's atomic read back (block_arrive returned; the expert's release follows
                         // only on its last arriver)
};
// Explicit points a task instance can stamp (its sub-spans: one more), by task id.
#define MKL_SUB_POINTS_QKV 3
#define MKL_SUB_POINTS_ATTN_CHUNK 5
#define MKL_SUB_POINTS_ATTN_MERGE 2
#define MKL_SUB_POINTS_OPROJ 4
#define MKL_SUB_POINTS_ROUTER_TOPK 4
#define MKL_SUB_POINTS_MOE_W13 5
#define MKL_SUB_POINTS_MOE_W2 3
// Sub-span names per task id, in point order (sub-span k is the k-th name): the profiled binary
// prints them with MKL_TASK_NAMES; bench/megakernel_layers_profile.py --subspans reads them.
#define MKL_SUBSPAN_NAMES                                                                        \
  "2=wait,norm,gemv,emit;3=wait,q_copy,loop_w0,loop_all,combine_w0,arrive;4=wait,merge_w0,arrive;" \
  "5=wait,copy,gemv,emit,router_part;6=fence,partials,hn,topk,publish;7=wait,hn_copy,gemv,emit,arrive,release;" \
  "8=wait,quant,gemv,emit"
