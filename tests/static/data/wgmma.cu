// wgmma for the ptxas-diagnostic check (nvcc -cubin -arch=sm_90a). With HZ_SERIAL a plain
// instruction redefines an accumulator between two wgmma of one pipeline stage, and ptxas
// serializes the wgmma ("Potential Performance Loss"); without it ptxas says nothing.
#include "hz_wgmma_m64n8k16.h"
__global__ void wgmma_two(float* out, uint64_t da, uint64_t db) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  HZ_WGMMA(da, db);
#ifdef HZ_SERIAL
  d0 += 1.0f;
#endif
  HZ_WGMMA(da + 1, db + 1);
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
