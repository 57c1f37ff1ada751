// Ragged-decode megakernel: sizes, parameters and the shared-memory layout (one TU:
// included by ragged_decode.cu only).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/hz_profiler.h"

namespace {

constexpr int HD = 128;            // head dim (fixed: the fragment mapping assumes it)
constexpr int CONSUMER_WARPS = 8;  // warp w computes KV head w (n_kv <= 8)
constexpr int CONSUMERS = CONSUMER_WARPS * 32;
constexpr int THREADS = CONSUMERS + 32;  // + one producer warp
constexpr int STEP = 16;           // tokens per stage (two n8 tiles for QK, one k16 for PV)
constexpr int STAGES = 3;
constexpr int ROW_PAD = 64;        // bytes added to each smem token row (bank spread)
constexpr int COMBINE_BATCH = 32;  // partials weighed per pass of the merge
constexpr int MAX_UNITS_PER_THREAD = 4;  // float4 accumulators per consumer thread (merge)
constexpr int CONSUMER_BAR = 1;    // named barrier id for the consumer warps only

enum Schedule : int { SCHED_GUIDED = 0, SCHED_SPLIT = 1 };
enum CounterIndex : int { CTR_WORK = 0, CTR_DONE = 1, CTR_ERROR = 2, CTR_ARRIVE = 3 };
enum ErrorBits : int { ERR_BAD_REQUEST = 1, ERR_SLOTS = 2 };
enum StageFlags : int { ST_FIRST = 1, ST_LAST = 2, ST_WHOLE = 4, ST_STOP = 8 };
// Diagnostics: stream K/V without computing, or compute without streaming (garbage out).
enum Probe : int { PROBE_NONE = 0, PROBE_STREAM_ONLY = 1, PROBE_COMPUTE_ONLY = 2 };
// Per-task profiler ids (hz_profiler.h; names exported by hz_rd_task_names). Numeric ids are
// the contract: the decoder and the faithful gate match spans by them.
enum Task : int {
  TASK_PROLOGUE = 1,  // per block: barrier init + the device-side schedule (entry to line built)
  TASK_ATTEND = 2,    // per piece: consumers from "free" to the piece's output/partial published
  TASK_MERGE = 3,     // per split request: the flash-decoding merge by the last arriver
  TASK_FILL = 4,      // block 0: outputs of empty/invalid requests
  TASK_WORKER = 5,    // per block: the whole persistent lifetime (entry to exit)
};
#define HZ_RD_TASK_NAMES "1=prologue,2=attend,3=merge,4=fill,5=worker"

struct Params {
  const __nv_bfloat16* q;   // (B, n_q, HD)
  const __nv_bfloat16* k;   // (rows, n_kv, HD)
  const __nv_bfloat16* v;
  const int* starts;        // (B,)
  const int* lens;          // (B,)
  float* out;               // (B, n_q*HD)
  float4* pacc;             // (n_slots, n_kv, 8, tq, 8) float4 partial accumulators
  float2* pml;              // (n_slots, n_q) partial (max, sum), max in the log2 domain
  int* ctr;                 // CTR_* then arrivals[B]
  long long rows;           // arena rows
  int B, n_q, n_kv, group, tq;
  int schedule, tile, phases, phase_chunks, n_slots;
  int probe;                // diagnostics only: PROBE_* (results are garbage when set)
  int contiguous;           // 1: one bulk copy per stage and tensor, unpadded rows (see produce)
  int stall_cycles;         // candidate knob (0 in production): consumers idle this long per stage
  float scale_log2;         // log2(e) / sqrt(HD)
  hz_prof_t prof;           // per-task profiler ring (used only in -DHZ_PROFILER builds)
};

struct StageDesc {  // written by the producer before it arms the stage's `full` barrier
  int req, slot, n, flags, piece_len, pad0, pad1, pad2;
};

// Dynamic shared memory (per block).
struct Smem {
  char* kst;         // [STAGES][STEP][row_stride] K rows
  char* vst;         // [STAGES][STEP][row_stride] V rows
  uint64_t* full;    // [STAGES]
  uint64_t* empty;   // [STAGES]
  StageDesc* desc;   // [STAGES]
  long long* pref;   // [B+1] line prefix of lengths (line = requests longest-first)
  int* tpref;        // [B+1] line prefix of tile counts (split schedule)
  int* order;        // [B] line position -> request
  int* pos;          // [B] request -> line position
  int* start;        // [B] per request
  int* len;          // [B] per request; -1 marks an invalid request
  float2* ml;        // [COMBINE_BATCH * n_q] partial (max, sum) of one merge batch
  float* w;          // [COMBINE_BATCH * n_q] merge weights
  float* m_head;     // [n_q] running max of the merge
  float* l_head;     // [n_q] running sum of the merge
  float* alpha;      // [n_q] rescale of the running accumulator for this batch
  int* slot;         // [COMBINE_BATCH]
  int* misc;         // [4]: last-arriver flag
  int row_stride;
};

__host__ __device__ inline int row_stride_bytes(int n_kv) { return n_kv * HD * 2 + ROW_PAD; }

__host__ __device__ inline size_t stage_bytes(int n_kv) {
  return (size_t)STAGES * STEP * row_stride_bytes(n_kv);
}

__host__ __device__ inline size_t smem_bytes(int B, int n_q, int n_kv) {
  return 2 * stage_bytes(n_kv) + 2 * STAGES * sizeof(uint64_t) + STAGES * sizeof(StageDesc) +
         sizeof(long long) * (B + 1) + sizeof(int) * (B + 1) + sizeof(int) * 4 * B +
         sizeof(float2) * COMBINE_BATCH * n_q + sizeof(float) * (COMBINE_BATCH * n_q + 3 * n_q) +
         sizeof(int) * (COMBINE_BATCH + 4);
}

__device__ inline Smem carve(char* base, int B, int n_q, int n_kv) {
  Smem s;
  s.row_stride = row_stride_bytes(n_kv);
  s.kst = base;
  s.vst = base + stage_bytes(n_kv);
  char* c = base + 2 * stage_bytes(n_kv);
  s.full = reinterpret_cast<uint64_t*>(c); c += STAGES * sizeof(uint64_t);
  s.empty = reinterpret_cast<uint64_t*>(c); c += STAGES * sizeof(uint64_t);
  s.desc = reinterpret_cast<StageDesc*>(c); c += STAGES * sizeof(StageDesc);
  s.pref = reinterpret_cast<long long*>(c);
  s.ml = reinterpret_cast<float2*>(s.pref + B + 1);  // 8-byte types first: aligned
  int* ip = reinterpret_cast<int*>(s.ml + COMBINE_BATCH * n_q);
  s.tpref = ip; ip += B + 1;
  s.order = ip; ip += B;
  s.pos = ip; ip += B;
  s.start = ip; ip += B;
  s.len = ip; ip += B;
  float* fp = reinterpret_cast<float*>(ip);
  s.w = fp; fp += COMBINE_BATCH * n_q;
  s.m_head = fp; fp += n_q;
  s.l_head = fp; fp += n_q;
  s.alpha = fp; fp += n_q;
  ip = reinterpret_cast<int*>(fp);
  s.slot = ip; ip += COMBINE_BATCH;
  s.misc = ip;
  return s;
}

}  // namespace
