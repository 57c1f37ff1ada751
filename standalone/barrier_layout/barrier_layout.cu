// barrier_layout.cu -- family `barrier_layout`: a release-flag + arrival-counter barrier
// whose words are laid out by parameters (HIP-portable; CUDA spelling).
//
// Hazards seeded:
//  * shared line (slot_stride 4): the MoE W13->W2 barrier of the MoE barrier report (in
//    the MI355 megakernel PR) kept eight write-through release flags at [0..7] and the
//    L2-atomic arrival counter at [8] of one 64-B line. On AMD the write-through releases
//    land in HBM, and an L2 write-back of the same line, still holding the old releases,
//    reverts them: waiters spin forever on a release that did fire. On NVIDIA the L2 is
//    the point of coherence for stores and atomics alike, so the mechanism does not exist
//    there; what remains is the cost of every poll and arrival hitting one line.
//  * false sharing (done_offset next to the arrival counter): an unrelated barrier's
//    counter in the same line - every arrival at one contends with the other.
//  * poll without acquire (poll 1): consumers spin on a volatile flag and then read the
//    producers' data with plain loads and no fence; stale L1 lines are read (~100% stale on
//    an H200, ../shared/notes/h200-measurements.md).
//  * hoisted poll (poll 2): a plain, non-volatile flag; the compiler loads it once and
//    spins on a register - a certain hang (the runtime build turns it into a timeout).
// Release kinds (release): 0 write-through store (the report's; AMD sc0 sc1, NVIDIA
// st.global.wt), 1 release store (st.release.gpu), 2 L2 atomic exchange (atom.release.gpu).
// Why the fixed variants are correct: every word has its own line (slot_stride 128 covers
// both AMD's 64-B and NVIDIA's 128-B lines) or every word of the shared line is an L2
// atomic; producers release their data before arriving (the last arrival also acquires the
// others' releases), and consumers poll with an acquire load.
//
// Two builds of this one source:
//  * point build (any of HZ_SLOT_STRIDE / HZ_DONE_OFFSET / HZ_POLL / HZ_RELEASE defined, or
//    HZ_STATIC_ONLY): one kernel, `hz_barrier_point`, for the point the -D parameters name,
//    with the report's unbounded spins, plus its layout as `hz_barrier_layout` (offset, size,
//    access, barrier rows) computed from the same macros as the addresses, so that
//    `hazards.static` checks the layout and the polls the compiler actually built. A
//    bounded spin can always exit, so the static hoisted-poll check needs these loops as
//    written. The point build's host harness refuses to run (it exists to be compiled).
//  * runtime build (no -D; what `hazards stress` builds): every poll x release kind as a
//    template instance, the layout a run-time parameter, every spin bounded by a time limit
//    (a lost release becomes a counted `spin_timeouts` and a mismatched launch, never a
//    hang), per-launch validation of every data word and of the barrier's final state, and
//    the kernel's duration measured on the device (%globaltimer) for the cost benchmark.
//
// clang-19 -x hip --offload-arch=gfx942 -nogpulib -nogpuinc --cuda-device-only -S
// -DHZ_STATIC_ONLY compiles the device code of a point for the AMDGCN checks.
#if defined(HZ_STATIC_ONLY) && defined(__HIP__)
#include "../common/compat.h"  // spells the device names and the loads for a device-only compile
#define HZ_TID __builtin_amdgcn_workitem_id_x()
#define HZ_BID __builtin_amdgcn_workgroup_id_x()
#else
#include "../common/harness.h"
#define HZ_TID threadIdx.x
#define HZ_BID blockIdx.x
#endif
#define HZ_THREADS 256  // the block size the kernel is launched with
#define HZ_RELEASES 8   // release fan-out (the report's one slot per XCD)

#if defined(HZ_STATIC_ONLY) || defined(HZ_SLOT_STRIDE) || defined(HZ_DONE_OFFSET) || defined(HZ_POLL) || \
    defined(HZ_RELEASE)
#define HZ_POINT_BUILD 1
#else
#define HZ_POINT_BUILD 0
#endif

enum { POLL_ACQUIRE = 0, POLL_VOLATILE = 1, POLL_PLAIN = 2 };
enum { REL_WRITE_THROUGH = 0, REL_STORE_RELEASE = 1, REL_ATOMIC = 2 };

#if HZ_POINT_BUILD
#ifndef HZ_SLOT_STRIDE
#define HZ_SLOT_STRIDE 128  // bytes between consecutive barrier words
#endif
#define HZ_COUNTER_OFFSET (HZ_RELEASES * HZ_SLOT_STRIDE)
#ifndef HZ_DONE_OFFSET
#define HZ_DONE_OFFSET (16 * 128)  // the consumers' barrier: far away unless seeded
#endif
#ifndef HZ_POLL
#define HZ_POLL POLL_ACQUIRE
#endif
#ifndef HZ_RELEASE
#define HZ_RELEASE REL_WRITE_THROUGH
#endif
// layout access codes: 0 atomic / 1 write-through / 2 plain store
#define HZ_REL_ACCESS (HZ_RELEASE == REL_WRITE_THROUGH ? 1 : HZ_RELEASE == REL_STORE_RELEASE ? 2 : 0)

// (offset, size, access, barrier id)
#define HZ_REL(x) (x) * HZ_SLOT_STRIDE, 4, HZ_REL_ACCESS, 0
__device__ __attribute__((used)) const uint32_t hz_barrier_layout[] = {
    HZ_REL(0), HZ_REL(1), HZ_REL(2), HZ_REL(3), HZ_REL(4), HZ_REL(5), HZ_REL(6), HZ_REL(7),
    HZ_COUNTER_OFFSET, 4, 0, 0,
    HZ_DONE_OFFSET, 4, 0, 1,
};
#if HZ_RELEASES != 8
#error "hz_barrier_layout lists 8 releases"
#endif
#endif  // HZ_POINT_BUILD

// Byte offsets of the barrier words from the (line-aligned) base.
struct BarrierLayout {
  int slot_stride;  // release flag x at x * slot_stride
  int counter;      // the producers' arrival counter
  int done;         // the consumers' arrival counter (a second barrier)
};

__device__ __forceinline__ uint32_t* hz_word(uint32_t* bar, int byte_offset) {
  return (uint32_t*)((char*)bar + byte_offset);
}

// Publish epoch `v` on a release flag.
template <int Release>
__device__ __forceinline__ void hz_release_store(uint32_t* p, uint32_t v) {
#if HZ_HIP
  if (Release == REL_WRITE_THROUGH) __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  else if (Release == REL_STORE_RELEASE) __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
  else __hip_atomic_exchange(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
#else
  // st.global.wt is a weak store in the PTX model (cache operators exist for weak stores
  // only): the report's write-through release, reproduced as written.
  if (Release == REL_WRITE_THROUGH) asm volatile("st.global.wt.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
  else if (Release == REL_STORE_RELEASE) asm volatile("st.release.gpu.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
  else {
    uint32_t old;
    asm volatile("atom.release.gpu.global.exch.b32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    (void)old;
  }
#endif
}

// A producer's arrival: releases its data; the last arrival also acquires everyone's (it
// publishes their data next). Returns the old count.
__device__ __forceinline__ uint32_t hz_arrive_producer(uint32_t* counter) {
#if HZ_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
  return __hip_atomic_fetch_add(counter, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
#endif
}

// A consumer's arrival at `done`: its reads of the data come before (release). Not a
// __threadfence: fence.sc invalidates this SM's L1 (CCTL.IVALL), which would hide the
// stale lines the no-acquire poll exists to expose.
__device__ __forceinline__ void hz_arrive_consumer(uint32_t* done) {
#if HZ_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
  __hip_atomic_fetch_add(done, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" : : "l"(done) : "memory");
#endif
}

// One read of a flag as the poll kind says: acquire, volatile (no acquire), or plain (which
// the compiler may hoist out of the spin loop). The loads are compat.h's.
template <int Poll>
__device__ __forceinline__ uint32_t hz_poll(uint32_t* p) {
  // compat.h's loads: the HZ_STATIC_ONLY build (clang-19, gfx942, no harness) includes
  // compat.h too (above), so both builds have them.
  if (Poll == POLL_ACQUIRE) return hz_ld_acquire_gpu(p);
  if (Poll == POLL_VOLATILE) return hz_ld_volatile(p);
  return *p;
}

__device__ __forceinline__ void hz_block_sync() {
#if HZ_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#else
  __syncthreads();
#endif
}

__device__ __forceinline__ uint32_t hz_value(uint32_t epoch, uint32_t producer, uint32_t i) {
  return epoch * 0x9E3779B1u ^ (producer << 20) ^ i;
}

#if HZ_POINT_BUILD
// ------------------------------------------------------------------------ point build --
// The report's barrier as written: unbounded spins, wrong words counted into `bad`.
struct RunCtl {
  uint32_t* bad;
};
#define HZ_STOPPED() false
#define HZ_DROPPED(rc, e, x) false
// Written out in place, not as a function: nvcc deletes a side-effect-free spin loop that
// sits in a device function of its own (C++ forward progress), but keeps it - hoisted
// plain load and all - in the caller, which is what the report's kernel did.
#define HZ_WAIT_AT_LEAST(Poll, p, target, rc) \
  while (hz_poll<Poll>(p) < (target)) {       \
  }
__device__ __forceinline__ void hz_count_wrong(const RunCtl& rc, uint32_t wrong) {
#if HZ_HIP
  __hip_atomic_fetch_add(rc.bad, wrong, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  atomicAdd(rc.bad, wrong);
#endif
}
__device__ __forceinline__ void hz_jitter(const RunCtl&, int) {}
__device__ __forceinline__ void hz_mark_start(const RunCtl&) {}
__device__ __forceinline__ void hz_mark_end(const RunCtl&) {}
#else
// ---------------------------------------------------------------------- runtime build --
// Per-launch control and result words, in their own allocation (never in a barrier line).
struct LaunchCtl {
  uint32_t abort;     // set by the first spin that gave up: every other spin stops too
  uint32_t timeouts;  // spins that reached the time limit
  uint32_t wrong;     // data words a consumer saw with the wrong value
  uint32_t pad;
  unsigned long long t_first;  // %globaltimer ns: earliest block start (reset to ~0)
  unsigned long long t_last;   // latest block end
};
struct RunCtl {
  LaunchCtl* ctl;
  unsigned long long limit_ns;  // a spin gives up after this long
  unsigned long long seed;      // per launch (jitter)
  int jitter;                   // random delay before each arrival, up to jitter*128 clocks
  int drop_epoch;               // emulated lost release: flag 0 is not written at this epoch (0: never)
};

__device__ __forceinline__ unsigned long long hz_now_ns() {
#if HZ_HIP
  return __builtin_amdgcn_s_memrealtime() * 10ull;  // gfx9 wall clock: 100 MHz (untested here)
#else
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

__shared__ int hz_stop;  // this block saw a timeout or the abort flag: leave the epoch loop
#define HZ_STOPPED() (hz_stop != 0)
#define HZ_DROPPED(rc, e, x) ((x) == 0 && (e) == (rc).drop_epoch)
#define HZ_WAIT_AT_LEAST(Poll, p, target, rc) hz_wait_at_least<Poll>(p, target, rc)

// Bounded spin. The abort flag is read once, before the loop: a volatile load inside would
// keep the compiler from hoisting a plain poll, and the hoisted poll is the hazard the
// `poll 2` variant exists to show (here: it spins on the clock until the limit).
template <int Poll>
__device__ __forceinline__ void hz_wait_at_least(uint32_t* p, uint32_t target, const RunCtl& rc) {
  if (*(volatile uint32_t*)&rc.ctl->abort) {
    hz_stop = 1;
    return;
  }
  const unsigned long long t0 = hz_now_ns();
  while (hz_poll<Poll>(p) < target) {
    if (hz_now_ns() - t0 > rc.limit_ns) {
      atomicAdd(&rc.ctl->timeouts, 1u);
      atomicExch(&rc.ctl->abort, 1u);
      hz_stop = 1;
      return;
    }
  }
}
__device__ __forceinline__ void hz_count_wrong(const RunCtl& rc, uint32_t wrong) { atomicAdd(&rc.ctl->wrong, wrong); }
__device__ __forceinline__ void hz_jitter(const RunCtl& rc, int e) {
  if (rc.jitter) {
    unsigned long long h = hz::splitmix64(rc.seed ^ ((unsigned long long)HZ_BID << 32) ^ (unsigned long long)e);
    hz_spin_cycles((long long)(h % (unsigned long long)(rc.jitter * 128 + 1)));
  }
}
__device__ __forceinline__ void hz_mark_start(const RunCtl& rc) {
  hz_stop = 0;
  atomicMin(&rc.ctl->t_first, hz_now_ns());
}
__device__ __forceinline__ void hz_mark_end(const RunCtl& rc) { atomicMax(&rc.ctl->t_last, hz_now_ns()); }
#endif

// `epochs` barrier rounds over co-resident blocks. Blocks [0, producers) write `words`
// values per epoch and arrive; the last arrival fans the epoch out to the HZ_RELEASES
// release flags. Blocks [producers, grid) consume: poll their flag, check every producer's
// data, then arrive at the `done` barrier, which producers wait on before overwriting the
// data. Thread 0 of each block does the barrier work; HZ_THREADS threads per block.
template <int Poll, int Release>
__device__ __forceinline__ void hz_barrier_rounds(const BarrierLayout L, uint32_t* bar, uint32_t* data,
                                                  const RunCtl& rc, int producers, int consumers, int words,
                                                  int epochs) {
  const int tid = HZ_TID, nthreads = HZ_THREADS;
  uint32_t* counter = hz_word(bar, L.counter);
  uint32_t* done = hz_word(bar, L.done);
  if (tid == 0) hz_mark_start(rc);
  if ((int)HZ_BID < producers) {
    const int p = HZ_BID;
    for (int e = 1; e <= epochs; ++e) {
      if (tid == 0 && e > 1) HZ_WAIT_AT_LEAST(Poll, done, (uint32_t)((e - 1) * consumers), rc);
      hz_block_sync();
      if (HZ_STOPPED()) break;
      for (int i = tid; i < words; i += nthreads) data[p * words + i] = hz_value(e, p, i);
      hz_block_sync();
      if (tid == 0) {
        hz_jitter(rc, e);
        if (hz_arrive_producer(counter) == (uint32_t)(e * producers - 1)) {
          for (int x = 0; x < HZ_RELEASES; ++x) {
            if (HZ_DROPPED(rc, e, x)) continue;
            hz_release_store<Release>(hz_word(bar, x * L.slot_stride), e);
          }
        }
      }
    }
  } else {
    const int c = HZ_BID - producers;
    uint32_t* release = hz_word(bar, (c % HZ_RELEASES) * L.slot_stride);
    for (int e = 1; e <= epochs; ++e) {
      if (tid == 0) HZ_WAIT_AT_LEAST(Poll, release, (uint32_t)e, rc);
      hz_block_sync();
      if (HZ_STOPPED()) break;
      uint32_t wrong = 0;
      for (int k = tid; k < producers * words; k += nthreads) {
        wrong += data[k] != hz_value(e, k / words, k % words);
      }
      if (wrong) hz_count_wrong(rc, wrong);
      hz_block_sync();
      if (tid == 0) {
        hz_jitter(rc, e);
        hz_arrive_consumer(done);
      }
    }
  }
  if (tid == 0) hz_mark_end(rc);
}

#if HZ_POINT_BUILD
__global__ void hz_barrier_point(uint32_t* bar, uint32_t* data, uint32_t* bad, int producers, int consumers,
                                 int words, int epochs) {
  const BarrierLayout L = {HZ_SLOT_STRIDE, HZ_COUNTER_OFFSET, HZ_DONE_OFFSET};
  const RunCtl rc = {bad};
  hz_barrier_rounds<HZ_POLL, HZ_RELEASE>(L, bar, data, rc, producers, consumers, words, epochs);
}
#endif

#if !defined(HZ_STATIC_ONLY)
#include "barrier_layout_host.h"  // the harness side: entry points, validation, parameters
#endif
