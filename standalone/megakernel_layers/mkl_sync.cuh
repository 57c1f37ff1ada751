// mkl_sync.cuh -- the barrier / flag / epoch layer of the layered MoE decode megakernel.
//
// Every inter-block hand-off of the megakernel goes through these functions: arrival
// counters (an L2 atomic add per block), release flags (a write-through store, the MoE barrier report's
// st_wt), acquire polls, the W13->W2 release fan-out, and the byte layout of all of them in
// one "sync arena". This is where the MI355 PR's deadlocks and lost releases live, so it is
// HIP-portable and compiles two ways:
//   * nvcc, sm_90a: included by megakernel_layers.cu (the runtime kernel);
//   * clang-19 -x hip --offload-arch=gfx942 -nogpuinc --cuda-device-only -S with
//     HZ_STATIC_ONLY (common/compat.h then spells the device names itself):
//     mkl_sync_static.cu instantiates these functions so hazards.static reads the AMDGCN
//     they emit (release-order/release-scope/acquire-missing) and the layout table.
//
// Three of the PR's classes are switches of this layer (each off in the fixed build):
//   * shared line (HZ_SHARED_LINE): the expert barrier's eight write-through release flags
//     and its atomic arrival counter in one 64-B line (stride 4 B; fixed: 128 B each). On
//     AMD an L2 write-back of the counter's line, still holding the old releases, reverts
//     releases that fired; waiters then hang.
//   * partials without release/acquire (HZ_PARTIAL_NO_FENCE): chunk workers' partials are
//     written by every thread, but only the leader arrives; without a release by every wave
//     (AMD: s_waitcnt is per wave) the merger may read stale partials. (Step 2, the production
//     before round 8: the switch also drops the last arriver's acquire. Step (d), in production
//     since (steps 5 and 10): the merge workers always acquire with their poll of the chunk count; the switch
//     drops the release only.)
//   * routing flag with no fence (HZ_ROUTING_NO_FENCE): the routing data are written by the
//     whole block, then one write-through flag store; nothing orders the two.
// Why the fixed forms are correct: every block-wide publish is "each wave releases (AMD) /
// the leader's gpu fence after the block barrier (CUDA: cumulative), then the atomic or the
// flag"; every consumer acquires (an acquire poll, or an acquire fence after learning from
// its own atomic that it is the last arriver) before reading; every barrier word has its
// own 128-B line.
#pragma once
#include "../common/compat.h"
#include "mkl_model.h"

namespace mkl {

// ---- the sync arena: byte offsets of every barrier word ------------------------------------
constexpr int LINE = 128;            // one word per 128-B line (NVIDIA line = two AMD lines)
constexpr int AMD_LINE = 64;         // the L2 line the lost-release mechanism works on
constexpr int RELEASE_FANOUT = 8;    // release flags per expert barrier (the MoE barrier report's one per XCD)
constexpr int OWN_LINE_STRIDE = 128;     // fixed: every release flag on its own line
constexpr int SHARED_LINE_STRIDE = 4;    // the MoE barrier report's layout: releases [0..7], counter [8]

enum SyncWord : int {
  W_LAYER_CTR = 0,     // W2 arrivals: QKV of the next layer waits for all of them
  W_QKV_CTR = 1,       // QKV tile arrivals: chunk workers wait for all of them
  W_CHUNK_CTR = 2,     // chunk arrivals: the last arriver merges
  W_ATTN_RELEASE = 3,  // merged attention released (epoch)
  W_OPROJ_CTR = 4,     // O-projection arrivals: the last arriver runs the router / top-k
  W_ROUTING = 5,       // routing published (epoch)
  W_MERGE_CTR = 6,     // campaign step (d) only: merge workers' arrivals; the last publishes ATTN_RELEASE
  N_SINGLE = 7,
};
constexpr int OFF_MOE = 8 * LINE;                       // expert barrier blocks start here
constexpr int MOE_BLOCK = (RELEASE_FANOUT + 1) * LINE;  // one block per expert id

MKL_HD constexpr int single_off(int w) { return w * LINE; }
MKL_HD constexpr int moe_release_off(int e, int x, int stride) { return OFF_MOE + e * MOE_BLOCK + x * stride; }
MKL_HD constexpr int moe_counter_off(int e, int stride) { return OFF_MOE + e * MOE_BLOCK + RELEASE_FANOUT * stride; }
MKL_HD constexpr long long sync_bytes(int E) { return OFF_MOE + (long long)E * MOE_BLOCK; }
MKL_HD constexpr int release_stride(int hazard) {
  return hazard == HZ_SHARED_LINE ? SHARED_LINE_STRIDE : OWN_LINE_STRIDE;
}
// Does release flag x of an expert block share an AMD L2 line with that block's counter?
MKL_HD constexpr bool release_shares_counter_line(int x, int stride) {
  return moe_release_off(0, x, stride) / AMD_LINE == moe_counter_off(0, stride) / AMD_LINE;
}

__device__ __forceinline__ uint32_t* word_at(uint32_t* base, int byte_off) {
  return reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(base) + byte_off);
}

// ---- primitives -------------------------------------------------------------------------

// Poll a flag or counter: acquire at gpu/agent scope (later loads see what it published).
__device__ __forceinline__ uint32_t poll_acquire(const uint32_t* p) { return hz_ld_acquire_gpu(p); }

// A relaxed read that is never cached in a register (snapshots, diagnostics).
__device__ __forceinline__ uint32_t load_relaxed(const uint32_t* p) { return hz_ld_volatile(p); }

// Release by every thread before a block barrier that a leader then publishes after.
// AMD: s_waitcnt vmcnt(0) and buffer_wbl2 are per wave, so each wave retires its own
// stores. CUDA: nothing here (the leader's fence after bar.sync is cumulative).
__device__ __forceinline__ void block_release_fence() {
#if HZ_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
#endif
}

// The leader's release before its atomic or flag store.
__device__ __forceinline__ void leader_release_fence() {
#if HZ_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
#else
  __threadfence();
#endif
}

// Acquire after learning (from one's own atomic) that every producer has arrived.
__device__ __forceinline__ void acquire_fence() {
#if HZ_HIP
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent");
#else
  __threadfence();
#endif
}

// Arrival: an atomic add at gpu/agent scope, performed in L2. Returns the old count.
__device__ __forceinline__ uint32_t arrive(uint32_t* ctr) {
#if HZ_HIP
  return __hip_atomic_fetch_add(ctr, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  return atomicAdd(ctr, 1u);
#endif
}

// A release flag store, write-through as the MoE barrier report's st_wt: AMD system scope (sc0 sc1, past
// L2 to memory); NVIDIA st.global.wt (a weak store; the fence before it orders it).
__device__ __forceinline__ void store_write_through(uint32_t* p, uint32_t v) {
#if HZ_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.global.wt.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
#endif
}

// ---- block-wide hand-offs (every thread of the block calls these) -------------------------

// This block's data are written; its leader arrives at `ctr`. Every thread gets the old
// count. `release` false drops the release (HZ_PARTIAL_NO_FENCE on the chunk barrier).
__device__ __forceinline__ uint32_t block_arrive(uint32_t* ctr, bool release, unsigned tid, uint32_t* s_word) {
  if (release) block_release_fence();
  __syncthreads();
  if (tid == 0) {
    if (release) leader_release_fence();
    *s_word = arrive(ctr);
  }
  __syncthreads();
  return *s_word;
}

// This block's data are written; its leader publishes `v` on `flag`. `release` false is
// HZ_ROUTING_NO_FENCE: a block barrier orders the stores inside the block, not their
// visibility to other blocks.
__device__ __forceinline__ void block_publish_flag(uint32_t* flag, uint32_t v, bool release, unsigned tid) {
  if (release) block_release_fence();
  __syncthreads();
  if (tid == 0) {
    if (release) leader_release_fence();
    store_write_through(flag, v);
  }
}

// Leader of the last W13 arriver of expert e: fan the epoch out to the release flags (it
// has acquired the other producers' data with acquire_fence, and releases them here).
__device__ __forceinline__ void release_fanout(uint32_t* sync, int e, int stride, uint32_t v) {
  leader_release_fence();
#pragma unroll
  for (int x = 0; x < RELEASE_FANOUT; ++x) store_write_through(word_at(sync, moe_release_off(e, x, stride)), v);
}

}  // namespace mkl
