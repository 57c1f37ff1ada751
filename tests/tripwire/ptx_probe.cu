// Every tripwire macro once, around a kernel with exactly one store of its own (out[i]).
// test_tripwire_codegen.py compiles this with and without -DHZ_TRIPWIRE and counts stores.
#include "hz_tripwire.h"

__global__ void probe(const unsigned* flag, unsigned want, float* out, int layers, hz_tw_t tw) {
  HZ_TW_BEGIN(tw, blockIdx.x);
  float acc = 0.f;
  for (int l = 0; l < layers; ++l) {
    HZ_TW_MARK(l, 3, threadIdx.x);
    HZ_TW_AUX(0, l);
    if (threadIdx.x == 0) {
      HZ_TW_MARK_SELF(l, 4, 0);
      unsigned obs;
      while ((obs = *(const volatile unsigned*)flag) < want + l) HZ_TW_POLL(7, obs, want + l);
      HZ_TW_PASSED(7, obs, want + l);
    }
    HZ_TW_WARP_ARRIVE(1 + l);
    __syncthreads();
    HZ_TW_WARP_EXIT(1 + l);
    acc += (float)l * threadIdx.x;
  }
  HZ_TW_END();
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
