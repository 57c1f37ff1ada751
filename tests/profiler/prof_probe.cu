// Every profiler macro once, around a kernel with exactly one store of its own (out[i]).
// test_profiler_codegen.py compiles this with and without -DHZ_PROFILER and counts stores.
#include "hz_profiler.h"

__global__ void probe(float* out, int tasks, hz_prof_t prof) {
  HZ_PROF_BEGIN(span);
  float acc = 0.f;
  for (int t = 0; t < tasks; ++t) {
    acc += (float)t * threadIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) HZ_PROF_END(prof, 7 + t, span, t);
    HZ_PROF_RESTAMP(span);
  }
  HZ_PROF_ONLY(if (threadIdx.x == 1) acc += 1.f;)
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
