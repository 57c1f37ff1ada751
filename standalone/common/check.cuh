// check.cuh -- device-side validation shared by every family binary.
//
// A batch never copies kernel outputs to the host: each launch is compared against the
// reference on the device, and the verdict is accumulated into one small `DeviceCheck`
// struct plus a bitmap with one bit per launch (so "mismatched launches" is exact, not an
// estimate from element counts). The host reads back ~100 bytes per batch.
//
// Families use: hz_fill_uniform (random inputs per batch), hz_compare_f32 (compare one
// launch's output with the reference and re-poison it for the next launch), and
// hz_report_bad (from their own check kernels, e.g. litmus post-conditions).
#pragma once

#include <float.h>
#include <stdint.h>

#include "compat.h"

namespace hz {

constexpr int kNumCounters = 8;

// Accumulators for one batch. Zeroed (first_bad_launch: all ones) before every batch.
struct DeviceCheck {
  unsigned long long bad_elements;         // elements/instances that disagreed, all launches
  unsigned long long mismatched_launches;  // launches with at least one bad element
  unsigned int max_rel_err_bits;           // float bits of the largest relative error (>= 0)
  unsigned int first_bad_launch;           // index of the first mismatched launch (~0u: none)
  unsigned long long counters[kNumCounters];  // family-defined counts (names from FamilySpec)
};

// The largest relative error we report for a non-finite output (poison survived, NaN
// produced): FLT_MAX, so that the reply stays valid JSON and sorts above every real error.
constexpr float kNonFiniteRelErr = FLT_MAX;

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// How many indices of [0, n) a grid-stride loop (i = block*threads + t, i += blocks*threads)
// visits in `block`: what a block that classifies each index once must have counted.
__host__ __device__ inline unsigned long long grid_stride_count(unsigned long long n, unsigned block,
                                                               unsigned threads, unsigned blocks) {
  const unsigned long long stride = (unsigned long long)threads * blocks, first = (unsigned long long)block * threads;
  const unsigned long long rem = n % stride;
  return n / stride * threads + (rem > first ? (rem - first < threads ? rem - first : threads) : 0);
}

// Record `nbad` bad elements (and the worst relative error seen) for `launch`. Safe to call
// from many threads; call once per warp or block where possible (it is three atomics).
__device__ inline void hz_report_bad(DeviceCheck* c, unsigned* launch_bits, long launch,
                                     unsigned long long nbad, float max_rel) {
  if (max_rel > 0.f) atomicMax(&c->max_rel_err_bits, __float_as_uint(max_rel));
  if (nbad == 0) return;
  atomicAdd(&c->bad_elements, nbad);
  unsigned bit = 1u << (launch & 31);
  unsigned old = atomicOr(&launch_bits[launch >> 5], bit);
  if (!(old & bit)) {  // first report for this launch: count the launch once
    atomicAdd(&c->mismatched_launches, 1ull);
    atomicMin(&c->first_bad_launch, (unsigned)launch);
  }
}

__global__ void hz_fill_uniform_kernel(float* p, size_t n, float lo, float hi, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t h = splitmix64(seed ^ splitmix64(i));
    float u = (float)(h >> 40) * (1.0f / 16777216.0f);  // 24 random bits in [0, 1)
    p[i] = lo + (hi - lo) * u;
  }
}

template <int kBlock>
__device__ inline void hz_block_reduce_report(unsigned long long nbad, float maxrel, DeviceCheck* c,
                                              unsigned* bits, long launch) {
  // warp reduce, then one report per warp (cheap: bad launches are the rare case)
  for (int off = HZ_WARP_SIZE / 2; off > 0; off >>= 1) {
#if HZ_HIP
    nbad += __shfl_down(nbad, off);
    maxrel = fmaxf(maxrel, __shfl_down(maxrel, off));
#else
    nbad += __shfl_down_sync(0xffffffffu, nbad, off);
    maxrel = fmaxf(maxrel, __shfl_down_sync(0xffffffffu, maxrel, off));
#endif
  }
  if ((threadIdx.x % HZ_WARP_SIZE) == 0 && (nbad || maxrel > 0.f)) hz_report_bad(c, bits, launch, nbad, maxrel);
}

// Compare out[0..n) with ref[0..n): bad when |o-r| > atol and |o-r|/|r| > rtol (rtol = atol
// = 0: bit-exact equality); NaN is always bad. With `repoison`, every element is overwritten
// with the NaN pattern after it was checked, so the next launch starts from poison without
// a separate memset.
__global__ void __launch_bounds__(256) hz_compare_f32_kernel(float* out, const float* ref, size_t n, float rtol,
                                                             float atol, long launch, DeviceCheck* c,
                                                             unsigned* bits, int repoison) {
  unsigned long long nbad = 0;
  float maxrel = 0.f;
  const bool exact = (rtol == 0.f && atol == 0.f);
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float o = out[i], r = ref[i];
    float d = fabsf(o - r);
    float rel = d / fmaxf(fabsf(r), 1e-30f);
    bool finite = isfinite(o);
    if (!finite) rel = kNonFiniteRelErr;
    bool bad = exact ? !(o == r) : (!finite || (d > atol && rel > rtol));
    nbad += bad;
    maxrel = fmaxf(maxrel, rel);
    if (repoison) out[i] = __uint_as_float(0xffffffffu);
  }
  hz_block_reduce_report<256>(nbad, maxrel, c, bits, launch);
}

}  // namespace hz
