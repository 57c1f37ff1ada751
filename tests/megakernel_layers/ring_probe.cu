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

// The QKV tiling of the build (test_qkv_spread.py reads the stored constants in the PTX): the tile's
// rows, the tiles of both shapes (mkl::SHAPE_DEFAULT and SHAPE_SMALL, spelled out: device code cannot
// read the host constants), and the column parts gemv_block takes at depth 4 for a whole tile of each
// shape (8-column chunks: 360 default, 128 small) and for the small shape's last tile.
__global__ void qkv_tile_probe(int* out) {
  using namespace mkl;
  const Shape dflt{2880, 64, 8, 32, 4, 2880}, small{1024, 16, 4, 8, 2, 1024};
  const int last_small = qkv_rows(small) - (qkv_tiles(small) - 1) * QKV_TILE_ROWS;
  out[0] = QKV_TILE_ROWS;
  out[1] = qkv_tiles(dflt);
  out[2] = qkv_tiles(small);
  out[3] = gemv_block_kparts(4, QKV_TILE_ROWS / GEMV_ROWS, 1, dflt.D / 8);
  out[4] = gemv_block_kparts(4, QKV_TILE_ROWS / GEMV_ROWS, 1, small.D / 8);
  out[5] = gemv_block_kparts(4, (last_small + GEMV_ROWS - 1) / GEMV_ROWS, 1, small.D / 8);
}
