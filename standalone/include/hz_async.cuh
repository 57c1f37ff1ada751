// hz_async.cuh -- thin wrappers over the sm_90 asynchronous-copy PTX: mbarriers and bulk
// copies (cp.async.bulk) that complete on an mbarrier's transaction count.
//
// Shared by the kernels that stream operands through shared memory with bulk copies (the
// ragged-decode megakernel, family mma_pingpong). CUDA sm_90+ only: there is no HIP
// spelling of these operations.
#pragma once
#include <stdint.h>

// A generic pointer into shared memory as the 32-bit shared-window address PTX expects.
__device__ __forceinline__ uint32_t hz_smem_addr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void hz_mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(hz_smem_addr(bar)), "r"(count) : "memory");
}

// Makes mbarrier initialisation visible to the asynchronous proxy (the bulk-copy engine
// that will complete transactions on it); follow it with a barrier before first use.
__device__ __forceinline__ void hz_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void hz_mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(hz_smem_addr(bar)) : "memory");
}

// Arrive once and expect `bytes` more bytes of bulk-copy transactions in this phase.
__device__ __forceinline__ void hz_mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(hz_smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Wait until the phase with parity `parity` has completed.
__device__ __forceinline__ void hz_mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(hz_smem_addr(bar)), "r"(parity)
        : "memory");
  }
}

// Global -> shared bulk copy of `bytes` (16-byte aligned, multiple of 16) completing on `bar`.
__device__ __forceinline__ void hz_bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   hz_smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(hz_smem_addr(bar))
               : "memory");
}

// The same with an L2 cache policy (from createpolicy).
__device__ __forceinline__ void hz_bulk_g2s_hint(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          hz_smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(hz_smem_addr(bar)), "l"(policy)
      : "memory");
}
