// wgmma with A from registers (nvcc -cubin -arch=sm_90a): the loop loads the next A fragment
// into the registers the in-flight wgmma reads (one wait_group 1 between), the register form
// of the MI355 PR's operand WAR. ptxas sees it and serializes every wgmma (C7513).
#include <cstdint>
__global__ void rs_rewrite(float* out, const uint32_t* a_in, uint64_t db, int tiles) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  uint32_t a0 = a_in[threadIdx.x * 4], a1 = a_in[threadIdx.x * 4 + 1];
  uint32_t a2 = a_in[threadIdx.x * 4 + 2], a3 = a_in[threadIdx.x * 4 + 3];
  for (int t = 0; t < tiles; ++t) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, "
                 "1, 1, 1, 0;"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    const uint32_t* next = a_in + (size_t)(t + 1) * 512 + threadIdx.x * 4;
    a0 = next[0], a1 = next[1], a2 = next[2], a3 = next[3];  // BROKEN: the wgmma may still read them
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
