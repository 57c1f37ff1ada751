// The block GEMV alone (mkl_kernel.cuh's gemv_block, a QKV-shaped call), so a test can read
// where its weights come from without building the whole family (test_weight_ring.py):
// global loads (gemv_round) in production, bulk copies into the shared-memory ring
// (ring_units) with campaign step (c), MKL_CAMPAIGN_STEP 4.
#include "mkl_kernel.cuh"

// What the host asks of a block of the default model (the launch's dynamic shared memory), as a
// constant in the PTX for test_weight_ring.py to read.
__device__ unsigned long long probe_smem_default = mkl::smem_bytes(mkl::SHAPE_DEFAULT);

__global__ void __launch_bounds__(mkl::THREADS, 1) gemv_probe(const __nv_bfloat16* w, const float* x, float* y,
                                                              int D, int r0, int r1) {
  extern __shared__ __align__(16) char smem_raw[];
  float* act = reinterpret_cast<float*>(smem_raw + mkl::RING_BYTES);  // the ring (if any) comes first
  __shared__ float red[mkl::GEMV_MAX_ITEMS * mkl::GEMV_ROWS];
#if MKL_WEIGHT_RING
  if (threadIdx.x == 0) mkl::ring_init();
#endif
  for (int i = threadIdx.x; i < D; i += mkl::THREADS) act[i] = x[i];
  __syncthreads();
  mkl::gemv_block(4, &w, 1, D, D, act, r0, r1, red, [&](int r, const float* a, int n) {
    for (int j = 0; j < n; ++j) y[r + j] = a[j];
  });
}

// The column parts gemv_block splits a row group into at depth 4, for the model's four GEMVs on one
// worker of the default shape at 132 workers (test_gemv_one_round.py reads the stored constants in
// the PTX): the QKV tile (16 row groups, 360 chunks), the O-projection (21-22 rows: 6 groups, 512),
// W13 (174-176 rows: 44 groups, 360) and W2 (6 groups, 4 expert segments, 360).
__global__ void kparts_probe(int* out) {
  out[0] = mkl::gemv_block_kparts(4, 16, 1, 360);
  out[1] = mkl::gemv_block_kparts(4, 6, 1, 512);
  out[2] = mkl::gemv_block_kparts(4, 44, 1, 360);
  out[3] = mkl::gemv_block_kparts(4, 6, 4, 360);
}
