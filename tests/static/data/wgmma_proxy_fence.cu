// Threads store a wgmma operand into shared memory (generic proxy) and a wgmma reads it
// (async proxy). The PTX memory model needs fence.proxy.async between the two; with
// HZ_NO_PROXY_FENCE it is missing (SASS: no FENCE.VIEW.ASYNC between the STS and the HGMMA).
#include "hz_wgmma_m64n8k16.h"
__global__ void wgmma_after_thread_stores(float* out, const uint4* src, uint64_t desc_hi) {
  __shared__ __align__(128) uint4 tile[128];
  tile[threadIdx.x] = src[threadIdx.x];
#ifndef HZ_NO_PROXY_FENCE
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
  __syncthreads();
  const uint64_t desc = desc_hi | ((uint64_t)(((uint32_t)__cvta_generic_to_shared(tile) & 0x3FFFF) >> 4));
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  HZ_WGMMA(desc, desc);
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
