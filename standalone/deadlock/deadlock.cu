// Family `deadlock`: the three persistent-grid deadlocks of the MI355 megakernel PR, each
// with its fix, every wait instrumented with the tripwire (hz_tripwire.h) so a hang turns
// into a sentence naming the barrier, the epoch and the stragglers.
//
// Seeded hazards (scenario + variant parameters; one kernel template per scenario):
//   * grid_barrier: a software grid barrier (atomic arrival counter, acquire poll) with
//     grid = co-residency limit + grid_extra. The limit comes from the occupancy API. With
//     grid_extra > 0 some blocks can only start when a resident block exits, and no
//     resident block exits before the barrier: hang. Fixed: grid <= limit.
//   * chunk_count: the chunk-merge barrier expects `chunks` arrivals, but the chunk phase
//     is nested inside the QKV guard (rank < qkv_tiles), so with chunks > qkv_tiles only
//     qkv_tiles workers ever arrive (the PR's 10-of-16). Everyone then waits for a
//     release that the merge never publishes. Fixed: the chunk phase is un-nested, every
//     rank < chunks arrives; chunks > workers is rejected as a bad request (the PR's guard).
//   * snapshot_epoch: each layer's release epoch is snapshotted at layer entry as
//     "counter + 1". Only `participants` workers arrive at the layer's first barrier, so a
//     non-participant that falls a layer behind (skew_ppm: chance per worker and layer of a
//     skew_cycles delay, the "workers skew freely" of the PR) reads a counter the layer's
//     merger already bumped and waits for a bump that layer never makes, while the next
//     layer's merger waits for that worker's MoE arrival: an intermittent hang.
//     Fixed "derive": the expected epoch is computed from the layer index (counters start
//     at 0 and bump once per layer, so the value is a pure function of the layer). Fixed
//     "widen": every worker arrives at the first barrier before the merger can bump, so
//     every snapshot happens-before the bump it waits for.
// Every launch also checks data: neighbours' tokens after the grid barrier, the merged
// chunk value after the release, the layer token published before each release; a wrong
// value is a mismatch (the barriers must order data, not only not hang).
#ifndef HZ_TRIPWIRE_OFF
#define HZ_TRIPWIRE 1
#endif
#include "../common/harness.h"
#include "../include/hz_tripwire.h"
#include "../include/hz_tripwire_host.h"
#include "../include/hz_tripwire_launches.h"
#include "deadlock_names.h"
// The tripwire's host half is plain C; compiled into this binary as part of its one TU.
#include "../tripwire_host/hz_tripwire_host.c"

namespace {

constexpr int kGridThreads = 256;  // 8 blocks per SM on an H200: limit = 8 x SMs
constexpr int kWorkerThreads = 128;

__host__ __device__ inline uint32_t token(uint64_t seed, uint32_t a, uint32_t b) {
  return (uint32_t)hz::splitmix64(seed ^ ((uint64_t)a << 32) ^ b) | 1u;  // never 0
}

__device__ inline uint32_t chunk_merge_value(uint64_t seed, int chunks) {
  uint32_t acc = 0;
  for (int c = 0; c < chunks; ++c) acc = acc * 31u + token(seed, 0, (uint32_t)c);
  return acc;
}

// The block barrier every kernel ends its rounds with, with per-warp points around it.
#define DL_BLOCK_SYNC(point)   \
  do {                         \
    HZ_TW_WARP_ARRIVE(point);  \
    __syncthreads();           \
    HZ_TW_WARP_EXIT(point);    \
  } while (0)

// ---------------------------------------------------------------------- grid barrier --
__global__ void __launch_bounds__(kGridThreads)
    grid_barrier_kernel(uint32_t* counter, uint32_t* data, int rounds, uint64_t seed, long launch,
                        hz::DeviceCheck* check, unsigned* bits, hz_tw_t tw) {
  HZ_TW_BEGIN(tw, blockIdx.x);
  const uint32_t G = gridDim.x, me = blockIdx.x;
  for (int r = 0; r < rounds; ++r) {
    HZ_TW_MARK(r, PHASE_GRID_WORK, me);
    if (threadIdx.x == 0) {
      data[(size_t)r * G + me] = token(seed, r, me);
      HZ_TW_MARK_SELF(r, PHASE_GRID_SYNC, me);
      __threadfence();  // release the token before arriving
      atomicAdd(counter, 1u);
      const uint32_t want = (uint32_t)(r + 1) * G;
      uint32_t obs;
      while ((obs = hz_ld_acquire_gpu(counter)) < want) HZ_TW_POLL(BAR_GRID, obs, want);
      HZ_TW_PASSED(BAR_GRID, obs, want);
      const uint32_t nb = (me + 1) % G;
      if (hz_ld_volatile(&data[(size_t)r * G + nb]) != token(seed, r, nb)) hz::hz_report_bad(check, bits, launch, 1, 1.f);
    }
    DL_BLOCK_SYNC(1 + r % 254);
  }
  HZ_TW_END();
}

// ----------------------------------------------------------------------- chunk count --
// ctr[0]: chunk arrivals, ctr[1]: attention release.
template <bool kNested>
__global__ void __launch_bounds__(kWorkerThreads)
    chunk_kernel(uint32_t* ctr, uint32_t* partial, uint32_t* merged, int qkv_tiles, int chunks, uint64_t seed,
                 long launch, hz::DeviceCheck* check, unsigned* bits, hz_tw_t tw) {
  const uint32_t rank = blockIdx.x;
  HZ_TW_BEGIN(tw, rank);
  HZ_TW_MARK(0, PHASE_QKV, rank);
  const bool has_qkv = rank < (uint32_t)qkv_tiles;
  // BROKEN when kNested: the chunk phase sits inside the QKV guard, so only
  // min(qkv_tiles, chunks) workers can ever arrive at a barrier that counts `chunks`.
  const bool chunk_worker = kNested ? (has_qkv && rank < (uint32_t)chunks) : (rank < (uint32_t)chunks);
  if (chunk_worker && threadIdx.x == 0) {
    HZ_TW_MARK_SELF(0, PHASE_ATTN_CHUNK, rank);
    partial[rank] = token(seed, 0, rank);
    __threadfence();
    atomicAdd(&ctr[0], 1u);
    uint32_t obs;
    while ((obs = hz_ld_acquire_gpu(&ctr[0])) < (uint32_t)chunks) HZ_TW_POLL(BAR_CHUNK_MERGE, obs, chunks);
    HZ_TW_PASSED(BAR_CHUNK_MERGE, obs, chunks);
    if (rank == 0) {  // chunk 0 merges once every chunk's partial is in
      HZ_TW_MARK_SELF(0, PHASE_ATTN_MERGE, rank);
      uint32_t acc = 0;
      for (int c = 0; c < chunks; ++c) acc = acc * 31u + hz_ld_volatile(&partial[c]);
      *merged = acc;
      hz_st_release_gpu(&ctr[1], 1u);
    }
  }
  if (threadIdx.x == 0) {
    HZ_TW_MARK_SELF(0, PHASE_WAIT_RELEASE, rank);
    uint32_t obs;
    while ((obs = hz_ld_acquire_gpu(&ctr[1])) < 1u) HZ_TW_POLL(BAR_ATTN_RELEASE, obs, 1u);
    HZ_TW_PASSED(BAR_ATTN_RELEASE, obs, 1u);
    if (hz_ld_volatile(merged) != chunk_merge_value(seed, chunks)) hz::hz_report_bad(check, bits, launch, 1, 1.f);
  }
  DL_BLOCK_SYNC(1);
  HZ_TW_END();
}

// -------------------------------------------------------------------- snapshot epoch --
enum EpochFix { kEpochBroken = 0, kEpochDerive = 1, kEpochWiden = 2 };

// ctr[0]: first-barrier arrivals, ctr[1]: attention release epoch, ctr[2]: MoE arrivals.
template <int kFix>
__global__ void __launch_bounds__(kWorkerThreads)
    epoch_kernel(uint32_t* ctr, uint32_t* layer_data, int participants, int layers, int skew_ppm,
                 long long skew_cycles, uint64_t seed, long launch, hz::DeviceCheck* check, unsigned* bits,
                 hz_tw_t tw) {
  const uint32_t rank = blockIdx.x, W = gridDim.x;
  const uint32_t parts = kFix == kEpochWiden ? W : (uint32_t)participants;
  HZ_TW_BEGIN(tw, rank);
  for (int l = 0; l < layers; ++l) {
    if (threadIdx.x == 0) {
      HZ_TW_MARK_SELF(l, PHASE_LAYER_ENTRY, rank);
      // BROKEN for kEpochBroken: "counter + 1" is this layer's epoch only if no merger of
      // this layer has bumped yet, and nothing orders a non-participant's read before it.
      const uint32_t want_rel = kFix == kEpochDerive ? (uint32_t)l + 1u : hz_ld_acquire_gpu(&ctr[1]) + 1u;
      HZ_TW_AUX(0, want_rel);
      if (rank < parts) {
        HZ_TW_MARK_SELF(l, PHASE_QKV, rank);
        __threadfence();
        const uint32_t old = atomicAdd(&ctr[0], 1u);
        if (old == parts * (uint32_t)(l + 1) - 1u) {  // last arrival of layer l: the merger
          HZ_TW_MARK_SELF(l, PHASE_MOE_W13_W2, rank);
          const uint32_t moe_want = W * (uint32_t)l;  // every worker's MoE tiles of layer l-1
          uint32_t obs;
          while ((obs = hz_ld_acquire_gpu(&ctr[2])) < moe_want) HZ_TW_POLL(BAR_MOE_W13_W2, obs, moe_want);
          HZ_TW_PASSED(BAR_MOE_W13_W2, obs, moe_want);
          layer_data[l] = token(seed, (uint32_t)l, 0);
          hz_st_release_gpu(&ctr[1], (uint32_t)l + 1u);
        }
      }
      HZ_TW_MARK_SELF(l, PHASE_WAIT_RELEASE, rank);
      uint32_t obs;
      while ((obs = hz_ld_acquire_gpu(&ctr[1])) < want_rel) HZ_TW_POLL(BAR_ATTN_RELEASE, obs, want_rel);
      HZ_TW_PASSED(BAR_ATTN_RELEASE, obs, want_rel);
      if (hz_ld_volatile(&layer_data[l]) != token(seed, (uint32_t)l, 0)) hz::hz_report_bad(check, bits, launch, 1, 1.f);
      HZ_TW_MARK_SELF(l, PHASE_MOE_W13_W2, rank);
      __threadfence();
      atomicAdd(&ctr[2], 1u);  // this worker's MoE tiles of layer l are done
      // skew: with probability skew_ppm/1e6 this worker falls behind before its next snapshot
      if (skew_ppm > 0 && l + 1 < layers &&
          hz::splitmix64(seed ^ ((uint64_t)rank << 24) ^ (uint64_t)l) % 1000000ull < (uint64_t)skew_ppm)
        hz_spin_cycles(skew_cycles);
    }
    DL_BLOCK_SYNC(1 + l % 254);
  }
  HZ_TW_END();
}

// ------------------------------------------------------------------------- host side --
HzTripwireLaunches g_tripwire("hz-deadlock");

struct Buffers {
  uint32_t* ctr = nullptr;
  uint32_t* data = nullptr;
  size_t words = 0;
  void ensure(size_t n) {
    if (!ctr) HZ_CHECK(cudaMalloc(&ctr, 16 * sizeof(uint32_t)));
    if (n <= words) return;
    if (data) HZ_CHECK(cudaFree(data));
    HZ_CHECK(cudaMalloc(&data, n * sizeof(uint32_t)));
    words = n;
  }
} g_buf;

int resident_limit(const hz::Device& d) {
  int per_sm = 0;
  HZ_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_barrier_kernel, kGridThreads, 0));
  return per_sm * d.prop.multiProcessorCount;
}

int worker_limit(const hz::Device& d) {
  int per_sm = 0;
  HZ_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, epoch_kernel<kEpochBroken>, kWorkerThreads, 0));
  return per_sm * d.prop.multiProcessorCount;
}

void validate(const hz::Params& p, const hz::Device& d) {
  const std::string& sc = p.s("scenario");
  if (sc == "grid_barrier") {
    if (resident_limit(d) + p.i("grid_extra") < 1) throw hz::BadRequest("grid_extra leaves no block");
    return;
  }
  const long long W = p.i("workers");
  if (W > worker_limit(d))
    throw hz::BadRequest("workers above the co-residency limit (" + std::to_string(worker_limit(d)) +
                         "): that deadlocks for the grid_barrier reason, not this scenario's");
  if (sc == "chunk_count" && p.i("chunks") > W)
    throw hz::BadRequest("chunks > workers: rejected, as the MI355 PR's guard does (no worker can serve them)");
  if (sc == "snapshot_epoch" && p.i("participants") > W) throw hz::BadRequest("participants > workers");
}

template <typename Launch>
void launch_loop(hz::Batch& b, uint32_t workers, Launch launch) {
  b.timer_start();
  for (long i = 0; i < b.launches; ++i) {
    HZ_CHECK(cudaMemsetAsync(g_buf.ctr, 0, 16 * sizeof(uint32_t), b.stream));
    launch(hz::splitmix64(b.seed + (uint64_t)i), i, g_tripwire.launch(workers));
    HZ_CHECK_LAUNCH();
    // One launch in flight at a time: the header's generation then names the launch that hangs.
    HZ_CHECK(cudaStreamSynchronize(b.stream));
  }
  b.timer_stop();
}

void run(hz::Batch& b) {
  const hz::Params& p = b.params;
  const std::string& sc = p.s("scenario");
  cudaStream_t st = b.stream;
  if (sc == "grid_barrier") {
    const int limit = resident_limit(b.device);
    const uint32_t G = (uint32_t)(limit + p.i("grid_extra"));
    const int rounds = (int)p.i("rounds");
    g_buf.ensure((size_t)rounds * G);
    b.metric("resident_limit", limit);
    b.metric("grid", G);
    launch_loop(b, G, [&](uint64_t seed, long i, hz_tw_t tw) {
      grid_barrier_kernel<<<G, kGridThreads, 0, st>>>(g_buf.ctr, g_buf.data, rounds, seed, i, b.check,
                                                       b.launch_bits, tw);
    });
  } else if (sc == "chunk_count") {
    const uint32_t W = (uint32_t)p.i("workers");
    const int Q = (int)p.i("qkv_tiles"), C = (int)p.i("chunks");
    g_buf.ensure((size_t)C + 1);
    auto kernel = p.b("nested") ? chunk_kernel<true> : chunk_kernel<false>;
    launch_loop(b, W, [&](uint64_t seed, long i, hz_tw_t tw) {
      kernel<<<W, kWorkerThreads, 0, st>>>(g_buf.ctr, g_buf.data, g_buf.data + C, Q, C, seed, i, b.check,
                                           b.launch_bits, tw);
    });
  } else {
    const uint32_t W = (uint32_t)p.i("workers");
    const int P = (int)p.i("participants"), L = (int)p.i("layers");
    const int ppm = (int)p.i("skew_ppm");
    const long long cycles = p.i("skew_cycles");
    const std::string& fix = p.s("epoch_fix");
    auto kernel = fix == "derive" ? epoch_kernel<kEpochDerive>
                  : fix == "widen" ? epoch_kernel<kEpochWiden>
                                   : epoch_kernel<kEpochBroken>;
    g_buf.ensure((size_t)L);
    launch_loop(b, W, [&](uint64_t seed, long i, hz_tw_t tw) {
      kernel<<<W, kWorkerThreads, 0, st>>>(g_buf.ctr, g_buf.data, P, L, ppm, cycles, seed, i, b.check,
                                           b.launch_bits, tw);
    });
  }
  b.metric("tripwire_mode", g_tripwire.mode_name());
}

// Parameters, variants and counters: standalone/deadlock/family.toml (embedded by the build).
hz::FamilySpec deadlock_spec() { return {validate, run}; }

}  // namespace

HZ_FAMILY_MAIN(deadlock_spec)
