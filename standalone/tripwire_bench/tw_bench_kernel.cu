// tw_bench_kernel.cu -- the tripwire overhead benchmark's kernel, compiled twice:
//   nvcc -c -DHZ_TRIPWIRE -DTW_BENCH_SUFFIX=on  ...   (every macro live)
//   nvcc -c               -DTW_BENCH_SUFFIX=off ...   (every macro compiled out)
// and linked into one binary (tw_bench_main.cu) that times both alternately.
//
// Shape of a persistent megakernel layer: `phases` phases of FMA work per layer, each
// announced with HZ_TW_MARK, then a grid-wide barrier (atomic arrival + acquire poll with
// HZ_TW_POLL/HZ_TW_PASSED) and a block barrier with per-warp arrival/exit points.
#include <cuda_runtime.h>
#include <stdint.h>

#include "../include/hz_tripwire.h"

#ifndef TW_BENCH_SUFFIX
#error "define TW_BENCH_SUFFIX (on/off)"
#endif
#define TW_CAT2(a, b) a##b
#define TW_CAT(a, b) TW_CAT2(a, b)
#define TW_NAME(x) TW_CAT(x, TW_BENCH_SUFFIX)

__global__ void __launch_bounds__(256) TW_NAME(tw_bench_kernel_)(unsigned* counter, float* out, int layers, int phases,
                                                               int work, hz_tw_t tw) {
  HZ_TW_BEGIN(tw, blockIdx.x);
  const unsigned G = gridDim.x;
  float a = 1.0f + threadIdx.x * 1e-6f, b = 0.999f;
  for (int l = 0; l < layers; ++l) {
    for (int p = 0; p < phases; ++p) {
      HZ_TW_MARK(l, 1 + p, blockIdx.x);
      for (int i = 0; i < work; ++i) a = fmaf(a, b, 1e-7f);
    }
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      const unsigned want = (unsigned)(l + 1) * G;
      unsigned obs = *(volatile unsigned*)counter;
      while (obs < want) {
        HZ_TW_POLL(1, obs, want);
        obs = *(volatile unsigned*)counter;
      }
      HZ_TW_PASSED(1, obs, want);
    }
    HZ_TW_WARP_ARRIVE(1 + l % 254);
    __syncthreads();
    HZ_TW_WARP_EXIT(1 + l % 254);
  }
  HZ_TW_END();
  out[blockIdx.x * blockDim.x + threadIdx.x] = a;
}

extern "C" cudaError_t TW_NAME(tw_bench_launch_)(int grid, unsigned* counter, float* out, int layers, int phases,
                                                 int work, hz_tw_t tw, cudaStream_t s) {
  cudaMemsetAsync(counter, 0, sizeof(unsigned), s);
  TW_NAME(tw_bench_kernel_)<<<grid, 256, 0, s>>>(counter, out, layers, phases, work, tw);
  return cudaGetLastError();
}
