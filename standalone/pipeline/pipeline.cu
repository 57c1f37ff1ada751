// Family `pipeline`: a software-pipelined dot-product loop that stages operand tiles through
// a shared-memory ring (1-4 stages), filled by plain stores or cp.async.
//
// Seeded hazards (all chosen by run-time parameters; the kernel is one template over
// <stages, copy kind>):
//   * WAR: the refill of a slot is issued before the barrier that proves every warp has
//     finished reading it (war_barrier=false). With 1 stage that is the classic
//     single-buffer race; with more stages the refill lands on the slot read one
//     iteration earlier.
//   * RAW: cp.async.wait_group allows one group too many in flight (wait_depth above the
//     schedule's correct depth), so a warp computes on a tile that has not landed.
//   * single exit tail: the last trip is peeled and reads slot 0, as a port written for a
//     trip count of 1 mod `stages` would (the MI355 PR's ping-pong exit-parity bug): right
//     at one parity, deterministically wrong at the other.
// Why the fixed schedules are correct: the refill of slot (t-1)%S is issued after the
// barrier of iteration t, which every warp reaches only after computing tile t-1 (WAR);
// cp.async.wait_group(correct depth) + that barrier guarantee tile t is in shared memory
// for every thread before anyone reads it (RAW); the tail reads slot (T-1)%S.
// Every output is compared bit-exactly with a plain global-memory dot product that uses
// the same fmaf order, so any staged value read at the wrong time shows as a mismatch.
#include "../common/harness.h"

namespace {

constexpr int kRows = 128;           // rows per block = threads per block (one row each)
constexpr int kTileK = 16;           // K elements per tile
constexpr int kLda = kTileK + 4;     // padded smem row (80 B: 16-byte aligned, conflict-free float4 reads)
constexpr int kChunksPerTile = kRows * kTileK / 4;  // float4 chunks of the A tile

struct Schedule {
  int ktiles;        // trip count T
  int war_barrier;   // refill after the barrier (1) or before it (0)
  int wait_depth;    // cp.async groups allowed in flight at the wait
  int single_tail;   // the peeled last trip reads slot 0 instead of (T-1)%S
  int jitter;        // per-warp delay before each compute: up to jitter*128 clocks
  unsigned long long seed;
};

template <int S>
__host__ __device__ constexpr size_t smem_floats() {
  return (size_t)S * (kRows * kLda + kTileK);
}

// Copy tile `tile` (K columns [tile*16, tile*16+16) of this block's 128 rows, and of x)
// into ring slot `slot`.
template <bool kCpAsync>
__device__ __forceinline__ void copy_tile(float* As, float* xs, const float* A, const float* x, int K,
                                          size_t r0, int tile, int slot) {
  const int tid = threadIdx.x;
  float* as = As + (size_t)slot * kRows * kLda;
#pragma unroll
  for (int j = 0; j < kChunksPerTile / kRows; ++j) {
    int c = tid + j * kRows;
    int row = c / (kTileK / 4), col = (c % (kTileK / 4)) * 4;
    const float* src = A + (r0 + row) * (size_t)K + (size_t)tile * kTileK + col;
    float* dst = as + row * kLda + col;
    if (kCpAsync) hz_cp_async_16(dst, src);
    else *(float4*)dst = *(const float4*)src;
  }
  if (tid < kTileK / 4) {
    const float* src = x + (size_t)tile * kTileK + tid * 4;
    float* dst = xs + slot * kTileK + tid * 4;
    if (kCpAsync) hz_cp_async_16(dst, src);
    else *(float4*)dst = *(const float4*)src;
  }
}

template <int S, bool kCpAsync>
__global__ void __launch_bounds__(kRows) pipeline_kernel(const float* __restrict__ A, const float* __restrict__ x,
                                                         float* __restrict__ y, int K, Schedule sc) {
  extern __shared__ float4 smem4[];
  float* As = (float*)smem4;
  float* xs = As + (size_t)S * kRows * kLda;
  const int tid = threadIdx.x;
  const size_t r0 = (size_t)blockIdx.x * kRows;
  const int T = sc.ktiles;
  const unsigned long long wseed = hz::splitmix64(sc.seed ^ ((unsigned long long)blockIdx.x << 8) ^ (tid / 32));

  auto issue = [&](int tile) {
    if (tile < T) copy_tile<kCpAsync>(As, xs, A, x, K, r0, tile, tile % S);
    if (kCpAsync) hz_cp_async_commit();  // always commit: keeps the group count uniform
  };

  float acc = 0.f;
  // One trip: make tile t resident (issuing the refill of the slot read last trip), then
  // consume the tile in `slot`.
  auto trip = [&](int t, int slot) {
    if (S == 1) {
      if (sc.war_barrier) __syncthreads();  // WAR: everyone is done with the previous tile
      issue(t);
    } else if (!sc.war_barrier) {
      issue(t + S - 1);  // BROKEN when reached: overwrites slot (t-1)%S while slow warps read it
    }
    if (kCpAsync) hz_cp_async_wait(sc.wait_depth);
    __syncthreads();  // RAW: tile t visible to all; and all warps finished trip t-1
    if (S > 1 && sc.war_barrier) issue(t + S - 1);
    if (sc.jitter) hz_spin_cycles((long long)(hz::splitmix64(wseed + t) % (unsigned long long)(sc.jitter * 128 + 1)));
    const float4* arow = (const float4*)(As + (size_t)slot * kRows * kLda + tid * kLda);
    const float* xv = xs + slot * kTileK;
#pragma unroll
    for (int q = 0; q < kTileK / 4; ++q) {
      float4 a = arow[q];
      acc = fmaf(a.x, xv[4 * q + 0], acc);
      acc = fmaf(a.y, xv[4 * q + 1], acc);
      acc = fmaf(a.z, xv[4 * q + 2], acc);
      acc = fmaf(a.w, xv[4 * q + 3], acc);
    }
  };

  for (int s = 0; s < S - 1; ++s) issue(s);  // prologue: S-1 tiles in flight
  for (int t = 0; t < T - 1; ++t) trip(t, t % S);
  // Exit tail (peeled last trip). Its slot depends on the trip count; the single-tail port
  // hard-codes slot 0, correct only when T-1 is a multiple of S (odd T for a ping-pong).
  trip(T - 1, sc.single_tail ? 0 : (T - 1) % S);
  y[r0 + tid] = acc;
}

// The reference: the same fmaf order straight from global memory, no staging.
__global__ void __launch_bounds__(kRows) golden_kernel(const float* __restrict__ A, const float* __restrict__ x,
                                                       float* __restrict__ y, int K) {
  size_t r = (size_t)blockIdx.x * kRows + threadIdx.x;
  const float* a = A + r * K;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc = fmaf(a[k], x[k], acc);
  y[r] = acc;
}

using KernelFn = void (*)(const float*, const float*, float*, int, Schedule);

KernelFn pick_kernel(int stages, bool cp_async) {
  switch (stages * 2 + (cp_async ? 1 : 0)) {
    case 2: return pipeline_kernel<1, false>;
    case 3: return pipeline_kernel<1, true>;
    case 4: return pipeline_kernel<2, false>;
    case 5: return pipeline_kernel<2, true>;
    case 6: return pipeline_kernel<3, false>;
    case 7: return pipeline_kernel<3, true>;
    case 8: return pipeline_kernel<4, false>;
    case 9: return pipeline_kernel<4, true>;
  }
  throw hz::BadRequest("stages must be 1..4");
}

size_t smem_bytes(int stages) {
  switch (stages) {
    case 1: return smem_floats<1>() * 4;
    case 2: return smem_floats<2>() * 4;
    case 3: return smem_floats<3>() * 4;
    default: return smem_floats<4>() * 4;
  }
}

// The wait depth that is exactly right for a schedule (groups allowed in flight).
int correct_wait_depth(int stages, bool war_barrier) {
  if (stages == 1) return 0;
  return war_barrier ? stages - 2 : stages - 1;
}

int grid_blocks(const hz::Params& p, const hz::Device& d) {
  long long b = p.i("blocks");
  return (int)(b > 0 ? b : 2 * d.prop.multiProcessorCount);
}

// Device buffers, kept across batches and regrown when the shape changes.
struct Buffers {
  float *A = nullptr, *x = nullptr, *y = nullptr, *ref = nullptr;
  size_t M = 0, K = 0;
  void ensure(size_t m, size_t k) {
    if (m == M && k == K) return;
    for (float* p : {A, x, y, ref})
      if (p) HZ_CHECK(cudaFree(p));
    HZ_CHECK(cudaMalloc(&A, m * k * sizeof(float)));
    HZ_CHECK(cudaMalloc(&x, k * sizeof(float)));
    HZ_CHECK(cudaMalloc(&y, m * sizeof(float)));
    HZ_CHECK(cudaMalloc(&ref, m * sizeof(float)));
    M = m;
    K = k;
  }
} g_buf;

// Check a few reference rows in double precision on the host: a broken reference would
// make every comparison meaningless.
void validate_reference(const Buffers& b, cudaStream_t st) {
  const size_t rows[3] = {0, b.M / 2, b.M - 1};
  std::vector<float> a(b.K), x(b.K);
  HZ_CHECK(cudaMemcpyAsync(x.data(), b.x, b.K * 4, cudaMemcpyDeviceToHost, st));
  for (size_t r : rows) {
    float got = 0.f;
    HZ_CHECK(cudaMemcpyAsync(a.data(), b.A + r * b.K, b.K * 4, cudaMemcpyDeviceToHost, st));
    HZ_CHECK(cudaMemcpyAsync(&got, b.ref + r, 4, cudaMemcpyDeviceToHost, st));
    HZ_CHECK(cudaStreamSynchronize(st));
    double want = 0, mag = 0;
    for (size_t k = 0; k < b.K; ++k) {
      want += (double)a[k] * x[k];
      mag += std::fabs((double)a[k] * x[k]);
    }
    if (!(std::fabs(got - want) <= 1e-5 * mag + 1e-6))
      throw hz::BadReference("reference row " + std::to_string(r) + " = " + std::to_string(got) + ", double gives " +
                             std::to_string(want));
  }
}

void validate(const hz::Params& p, const hz::Device& d) {
  if (p.s("copy") == "cp_async" && !HZ_HOST_HAS_CP_ASYNC)
    throw hz::Unsupported("copy=cp_async needs CUDA sm_80+ (this build has no cp.async)");
  long long depth = p.i("wait_depth");
  if (depth > 7) throw hz::BadRequest("wait_depth above 7");
  double bytes = (double)grid_blocks(p, d) * kRows * p.i("ktiles") * kTileK * 4.0;
  if (bytes > 4e9) throw hz::BadRequest("blocks*128 x ktiles*16 floats exceeds 4 GB");
}

void run(hz::Batch& b) {
  const hz::Params& p = b.params;
  const int stages = (int)p.i("stages");
  const bool cp = p.s("copy") == "cp_async";
  const int blocks = grid_blocks(p, b.device);
  const int T = (int)p.i("ktiles");
  const size_t M = (size_t)blocks * kRows, K = (size_t)T * kTileK;
  Schedule sc;
  sc.ktiles = T;
  sc.war_barrier = p.b("war_barrier");
  sc.wait_depth = p.i("wait_depth") < 0 ? correct_wait_depth(stages, sc.war_barrier) : (int)p.i("wait_depth");
  sc.single_tail = p.s("tail") == "single";
  sc.jitter = (int)p.i("jitter");
  KernelFn kernel = pick_kernel(stages, cp);
  const size_t smem = smem_bytes(stages);
  HZ_CHECK(cudaFuncSetAttribute((const void*)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));

  g_buf.ensure(M, K);
  b.fill_uniform(g_buf.A, M * K, -1.f, 1.f, 1);
  b.fill_uniform(g_buf.x, K, -1.f, 1.f, 2);
  golden_kernel<<<blocks, kRows, 0, b.stream>>>(g_buf.A, g_buf.x, g_buf.ref, (int)K);
  HZ_CHECK_LAUNCH();
  if (b.validate) {
    validate_reference(g_buf, b.stream);
    b.poison(g_buf.y, M * sizeof(float));
  }
  b.metric("effective_wait_depth", sc.wait_depth);
  b.metric("correct_wait_depth", correct_wait_depth(stages, sc.war_barrier));
  b.timer_start();
  for (long i = 0; i < b.launches; ++i) {
    sc.seed = hz::splitmix64(b.seed + (unsigned long long)i);
    kernel<<<blocks, kRows, smem, b.stream>>>(g_buf.A, g_buf.x, g_buf.y, (int)K, sc);
    HZ_CHECK_LAUNCH();
    if (b.validate) b.compare_f32(g_buf.y, g_buf.ref, M, i);  // bit-exact; re-poisons y
    b.launched();
  }
  b.timer_stop();
}

// Parameters, variants and counters: standalone/pipeline/family.toml (embedded by the build).
hz::FamilySpec pipeline_spec() { return {validate, run}; }

}  // namespace

HZ_FAMILY_MAIN(pipeline_spec)
