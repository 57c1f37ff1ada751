// Ragged-decode megakernel: thin wrappers over the PTX it uses beyond hz_async.cuh
// (mbarrier and bulk copy live there): L2 policy/prefetch, named barrier, mma.sync, movmatrix.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "../include/hz_async.cuh"
#include "layout.cuh"

namespace {

// ---- PTX wrappers ------------------------------------------------------------------------

// K/V are read exactly once: mark them first to leave L2 (keeps Q and partials resident).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(CONSUMER_BAR), "n"(CONSUMERS) : "memory");
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Dim held by accumulator element c of m-tile mt at lane group g (docs/megakernel.md):
// lane (g, t) reads dims 32j + 8t + 0..7 of its token, and the movmatrix transpose turns
// register q of that read into rows of the PV A operand.
__device__ __forceinline__ int acc_dim(int mt, int c, int g) {
  return 32 * (mt >> 1) + 8 * (g >> 1) + 4 * (mt & 1) + 2 * (c >> 1) + (g & 1);
}

}  // namespace
