// The layer head's two single-block tasks alone (the LSE merge, the router), so a test can
// read their machine code without building the whole family (test_head_codegen.py).
#include "mkl_kernel.cuh"

__global__ void merge_probe(const float* partials, float* out, int NQ, int C) {
  extern __shared__ float arena[];
  mkl::merge_chunks(partials, out, NQ, C, arena);
}

__global__ void router_probe(mkl::Shape s, const float* h, const float* norm, const __nv_bfloat16* wr, float* hn,
                             int* ids, float* wts) {
  extern __shared__ float arena[];
  __shared__ mkl::SmemHead hd;
  mkl::router_topk(s, h, norm, wr, hn, ids, wts, arena, &hd);
}

#if MKL_CAMPAIGN_STEP >= 3
// step (b): the router folded into the O-projection (built here so every step compiles)
__global__ void router_b_probe(mkl::Shape s, const float* hrows_g, const float* h, const float* norm,
                               const __nv_bfloat16* wr, float* part, float* hn, int* ids, float* wts) {
  extern __shared__ float arena[];
  for (int i = threadIdx.x; i < 64; i += blockDim.x) arena[i] = hrows_g[i];
  __syncthreads();
  mkl::router_partials(s, arena, 0, 64, norm, wr, part);
  mkl::router_from_partials(s, h, norm, part, 132, hn, ids, wts, arena + 64);
}
#endif
