// barrier_layout.cu -- family `barrier_layout`: a release-flag + arrival-counter barrier
// whose words are laid out by compile-time parameters (HIP-portable; CUDA spelling).
//
// Hazards seeded:
//  * shared line (HZ_SLOT_STRIDE=4): the seed's MoE W13->W2 barrier
//    (002_79daa8f540f6a64d.txt) kept eight write-through release flags at [0..7] and the
//    L2-atomic arrival counter at [8] of one 64-B line. On AMD the write-through releases
//    land in HBM, and an L2 write-back of the same line, still holding the old releases,
//    reverts them: waiters spin forever on a release that did fire.
//  * false sharing (HZ_DONE_OFFSET next to the arrival counter): an unrelated barrier's
//    counter in the same line - every arrival at one invalidates the other.
//  * poll without acquire (HZ_POLL=1): consumers spin on a volatile flag and then read the
//    producers' data with plain loads and no fence; stale L1 lines are read (~100% stale on
//    an H200, ../shared/notes/h200-measurements.md).
//  * hoisted poll (HZ_POLL=2): a plain, non-volatile flag; the compiler loads it once and
//    spins on a register - a certain hang.
// Why the fixed variant is correct: every word has its own line (HZ_SLOT_STRIDE=128 covers
// both AMD's 64-B and NVIDIA's 128-B lines), producers release with a gpu-scope fence
// before their arrival, and consumers poll with an acquire load.
//
// The layout the kernel uses is also emitted into the binary as `hz_barrier_layout`
// (offset, size, access, barrier) rows, computed from the same macros as the addresses,
// so `hazards.static` checks the layout the compiler actually built.
//
// Builds: nvcc -arch=sm_90a (runtime harness below; THE H200 RUN IS NOT DONE YET) and
// clang-19 -x hip --offload-arch=gfx942 -nogpulib -nogpuinc --cuda-device-only -S
// -DHZ_STATIC_ONLY (device code only, for the AMDGCN checks).
#if defined(HZ_STATIC_ONLY) && defined(__HIP__)
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __forceinline__ inline __attribute__((always_inline))
#define HZ_HIP 1
#define HZ_TID __builtin_amdgcn_workitem_id_x()
#define HZ_BID __builtin_amdgcn_workgroup_id_x()
typedef unsigned int uint32_t;
#else
#include "../common/compat.h"
#define HZ_TID threadIdx.x
#define HZ_BID blockIdx.x
#endif
#define HZ_THREADS 256  // the block size the kernel is launched with

#ifndef HZ_SLOT_STRIDE
#define HZ_SLOT_STRIDE 128  // bytes between consecutive barrier words
#endif
#ifndef HZ_RELEASES
#define HZ_RELEASES 8  // release fan-out (the seed's one slot per XCD)
#endif
#define HZ_COUNTER_OFFSET (HZ_RELEASES * HZ_SLOT_STRIDE)
#ifndef HZ_DONE_OFFSET
#define HZ_DONE_OFFSET (16 * 128)  // the consumers' barrier: far away unless seeded
#endif
#ifndef HZ_POLL
#define HZ_POLL 0  // 0 acquire load, 1 volatile load without acquire, 2 plain load
#endif
#define HZ_WORDS_BYTES (HZ_DONE_OFFSET + 4 > HZ_COUNTER_OFFSET + 4 ? HZ_DONE_OFFSET + 4 : HZ_COUNTER_OFFSET + 4)

// (offset, size, access: 0 atomic / 1 write-through / 2 plain, barrier id)
#define HZ_REL(x) (x) * HZ_SLOT_STRIDE, 4, 1, 0
__device__ __attribute__((used)) const uint32_t hz_barrier_layout[] = {
    HZ_REL(0), HZ_REL(1), HZ_REL(2), HZ_REL(3), HZ_REL(4), HZ_REL(5), HZ_REL(6), HZ_REL(7),
    HZ_COUNTER_OFFSET, 4, 0, 0,
    HZ_DONE_OFFSET, 4, 0, 1,
};
#if HZ_RELEASES != 8
#error "hz_barrier_layout lists 8 releases"
#endif

__device__ __forceinline__ uint32_t* hz_word(uint32_t* bar, int byte_offset) {
  return (uint32_t*)((char*)bar + byte_offset);
}

// Write-through store of a release flag (AMD: sc0 sc1, the seed's st_wt; NVIDIA: st.wt).
__device__ __forceinline__ void hz_store_wt(uint32_t* p, uint32_t v) {
#if HZ_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.global.wt.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
#endif
}

// gpu/agent-scope arrival: release fence, then an L2 atomic add. Returns the old count.
__device__ __forceinline__ uint32_t hz_arrive(uint32_t* counter) {
#if HZ_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
  return __hip_atomic_fetch_add(counter, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  __threadfence();
  return atomicAdd(counter, 1u);
#endif
}

__device__ __forceinline__ void hz_count(uint32_t* p, uint32_t n) {
#if HZ_HIP
  __hip_atomic_fetch_add(p, n, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  atomicAdd(p, n);
#endif
}

__device__ __forceinline__ uint32_t hz_poll(uint32_t* p) {
#if HZ_POLL == 0 && HZ_HIP
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
#elif HZ_POLL == 0
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#elif HZ_POLL == 1
  return *(volatile uint32_t*)p;
#else
  return *p;
#endif
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

// Launched with HZ_THREADS threads per block. Blocks [0, producers) produce `words` values per epoch and arrive; the last arrival
// fans the epoch out to the HZ_RELEASES release flags. Blocks [producers, grid) consume:
// poll their flag, check every producer's data, then arrive at the `done` barrier, which
// producers wait on before overwriting the data. All blocks must be co-resident.
__global__ void hz_barrier_kernel(uint32_t* bar, uint32_t* data, uint32_t* bad,
                                  int producers, int consumers, int words, int epochs) {
  const int tid = HZ_TID, nthreads = HZ_THREADS;
  uint32_t* counter = hz_word(bar, HZ_COUNTER_OFFSET);
  uint32_t* done = hz_word(bar, HZ_DONE_OFFSET);
  if ((int)HZ_BID < producers) {
    const int p = HZ_BID;
    for (int e = 1; e <= epochs; ++e) {
      if (tid == 0 && e > 1) {
        while (hz_poll(done) < (uint32_t)((e - 1) * consumers)) {
        }
      }
      hz_block_sync();
      for (int i = tid; i < words; i += nthreads) data[p * words + i] = hz_value(e, p, i);
      hz_block_sync();
      if (tid == 0 && hz_arrive(counter) == (uint32_t)(e * producers - 1)) {
        for (int x = 0; x < HZ_RELEASES; ++x) hz_store_wt(hz_word(bar, x * HZ_SLOT_STRIDE), e);
      }
    }
  } else {
    const int c = HZ_BID - producers;
    uint32_t* release = hz_word(bar, (c % HZ_RELEASES) * HZ_SLOT_STRIDE);
    for (int e = 1; e <= epochs; ++e) {
      if (tid == 0) {
        while (hz_poll(release) < (uint32_t)e) {
        }
      }
      hz_block_sync();
      uint32_t wrong = 0;
      for (int k = tid; k < producers * words; k += nthreads) {
        wrong += data[k] != hz_value(e, k / words, k % words);
      }
      if (wrong) hz_count(bad, wrong);
      hz_block_sync();
      if (tid == 0) hz_arrive(done);
    }
  }
}

#if !defined(HZ_STATIC_ONLY)
// Host harness: `barrier_layout [epochs] [words]`; grid = one block per SM (co-resident),
// an eighth of them producers. Prints one HZ_RESULT line (docs/protocol.md); exit 0 clean,
// 1 stale data seen, 3 device error. NOT YET RUN ON AN H200 (deferred).
#include <stdio.h>
#include <stdlib.h>

#define HZ_CHECK(call)                                                                   \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      printf("HZ_RESULT {\"status\": \"fault\", \"message\": \"%s\"}\n", cudaGetErrorString(e_)); \
      return 3;                                                                          \
    }                                                                                    \
  } while (0)

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? atoi(argv[1]) : 1000;
  const int words = argc > 2 ? atoi(argv[2]) : 1024;
  if (epochs < 1 || words < 1) {
    printf("HZ_RESULT {\"status\": \"bad_request\", \"message\": \"epochs and words must be > 0\"}\n");
    return 2;
  }
  int dev = 0, sms = 0;
  HZ_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  HZ_CHECK(cudaGetDeviceProperties(&prop, dev));
  sms = prop.multiProcessorCount;
  const int blocks = sms, producers = blocks / 8 > 0 ? blocks / 8 : 1;
  uint32_t *bar, *data, *bad;
  HZ_CHECK(cudaMalloc((void**)&bar, HZ_WORDS_BYTES + 256));
  HZ_CHECK(cudaMalloc((void**)&data, (size_t)producers * words * 4));
  HZ_CHECK(cudaMalloc((void**)&bad, 4));
  HZ_CHECK(cudaMemset(bar, 0, HZ_WORDS_BYTES + 256));
  HZ_CHECK(cudaMemset(bad, 0, 4));
  cudaEvent_t t0, t1;
  HZ_CHECK(cudaEventCreate(&t0));
  HZ_CHECK(cudaEventCreate(&t1));
  HZ_CHECK(cudaEventRecord(t0));
  hz_barrier_kernel<<<blocks, HZ_THREADS>>>(bar, data, bad, producers, blocks - producers, words,
                                            epochs);
  HZ_CHECK(cudaGetLastError());
  HZ_CHECK(cudaEventRecord(t1));
  HZ_CHECK(cudaEventSynchronize(t1));
  float ms = 0.f;
  HZ_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  uint32_t h_bad = 0;
  HZ_CHECK(cudaMemcpy(&h_bad, bad, 4, cudaMemcpyDeviceToHost));
  printf("HZ_RESULT {\"status\": \"ok\", \"launches\": 1, \"mismatched\": %d, \"bad_elements\": %u, "
         "\"kernel_ms\": %.4f, \"metrics\": {\"us_per_epoch\": %.4f, \"slot_stride\": %d, "
         "\"done_offset\": %d, \"poll\": %d}}\n",
         h_bad ? 1 : 0, h_bad, ms, 1000.0 * ms / epochs, HZ_SLOT_STRIDE, HZ_DONE_OFFSET, HZ_POLL);
  return h_bad ? 1 : 0;
}
#endif
