// mkl_sync_static.cu -- the megakernel's synchronisation layer (mkl_sync.cuh), instantiated
// the way the megakernel uses it, for the static checks on emitted AMDGCN.
//
//   clang-19 -x hip --offload-arch=gfx942 -nogpulib -nogpuinc --cuda-device-only -O3 -S \
//       -DHZ_STATIC_ONLY -DMKL_HAZARD=<switch> mkl_sync_static.cu
//
// Each kernel below is one hand-off of the megakernel reduced to its synchronisation (the
// same functions, the same order, the same stores and polls; the arithmetic between them
// replaced by stores of the data): hazards.static then checks release/acquire order and
// scope on the gfx942 listing, and reads the layout table `hz_barrier_layout` (offset, size,
// access, barrier id) computed by the same offset functions the megakernel addresses with.
// MKL_HAZARD selects the switch (mkl::Hazard); only the sync classes change this file's
// output: HZ_SHARED_LINE (layout), HZ_PARTIAL_NO_FENCE, HZ_ROUTING_NO_FENCE.
#include "mkl_sync.cuh"

#ifndef MKL_HAZARD
#define MKL_HAZARD 0
#endif

#if defined(HZ_HIP_STATIC)
#define MKL_TID hz_static_tid()
#define MKL_BID hz_static_bid()
#else
#define MKL_TID threadIdx.x
#define MKL_BID blockIdx.x
#endif

namespace {
constexpr int kThreads = 256;
constexpr int kStride = mkl::release_stride(MKL_HAZARD);
constexpr bool kPartialRelease = MKL_HAZARD != mkl::HZ_PARTIAL_NO_FENCE;
constexpr bool kRoutingRelease = MKL_HAZARD != mkl::HZ_ROUTING_NO_FENCE;
}  // namespace

// Access codes of the layout table: 0 atomic (L2 read-modify-write), 1 write-through store,
// 2 plain store. Two expert blocks, so a block that spills into its neighbour shows.
#define MKL_SINGLE(w, access) mkl::single_off(w), 4, access, (w) + 1
#define MKL_REL(e, x) mkl::moe_release_off(e, x, kStride), 4, 1, 100 + (e)
#define MKL_EXPERT(e)                                                                              \
  MKL_REL(e, 0), MKL_REL(e, 1), MKL_REL(e, 2), MKL_REL(e, 3), MKL_REL(e, 4), MKL_REL(e, 5), MKL_REL(e, 6), \
      MKL_REL(e, 7), mkl::moe_counter_off(e, kStride), 4, 0, 100 + (e)
__device__ __attribute__((used)) const uint32_t hz_barrier_layout[] = {
    MKL_SINGLE(mkl::W_LAYER_CTR, 0), MKL_SINGLE(mkl::W_QKV_CTR, 0),     MKL_SINGLE(mkl::W_CHUNK_CTR, 0),
    MKL_SINGLE(mkl::W_ATTN_RELEASE, 1), MKL_SINGLE(mkl::W_OPROJ_CTR, 0), MKL_SINGLE(mkl::W_ROUTING, 1),
    MKL_SINGLE(mkl::W_MERGE_CTR, 0),  // campaign step (d)'s merge arrivals (mkl_kernel.cuh)
    MKL_EXPERT(0), MKL_EXPERT(1),
};
static_assert(mkl::RELEASE_FANOUT == 8, "MKL_EXPERT lists 8 release flags");

// Attention chunk (production, campaign step (d)): every thread writes its share of the
// partials, the leader arrives at CHUNK; the merge workers (mkl_static_merge) merge.
__global__ void mkl_static_chunk(uint32_t* sync, float* partials, int words, uint32_t epoch) {
  __shared__ uint32_t s_word;
  const unsigned tid = MKL_TID, c = MKL_BID;
  for (int i = (int)tid; i < words; i += kThreads) partials[(long long)c * words + i] = (float)(i ^ (int)epoch);
  mkl::block_arrive(mkl::word_at(sync, mkl::single_off(mkl::W_CHUNK_CTR)), kPartialRelease, tid, &s_word);
}

// Merge worker (campaign step (d), in production since round 8: steps 5, 10, 14, 15, 21 and 22): the leader polls the chunk count,
// the block merges its heads from every chunk's partials and arrives at MERGE; the block whose
// arrival completes the count learns it from its own atomic, acquires the other merge workers'
// heads and releases ATTN_RELEASE (the W13 fan-out's pattern). The merge workers always acquire:
// partial_no_fence drops only the chunk blocks' release (mkl_kernel.cuh says why).
__global__ void mkl_static_merge(uint32_t* sync, const float* partials, float* attn_out, int chunks,
                                 int merge_workers, int words, uint32_t epoch) {
  __shared__ uint32_t s_word;
  const unsigned tid = MKL_TID, m = MKL_BID;
  if (tid == 0) {
    while (mkl::poll_acquire(mkl::word_at(sync, mkl::single_off(mkl::W_CHUNK_CTR))) < (uint32_t)chunks * epoch) {
    }
  }
  __syncthreads();
  for (int i = (int)(m * kThreads + tid); i < words; i += merge_workers * kThreads) {
    float acc = 0.f;
    for (int k = 0; k < chunks; ++k) acc += partials[(long long)k * words + i];
    attn_out[i] = acc;
  }
  const uint32_t old = mkl::block_arrive(mkl::word_at(sync, mkl::single_off(mkl::W_MERGE_CTR)), true, tid, &s_word);
  if (old + 1 != (uint32_t)merge_workers * epoch) return;
  mkl::acquire_fence();
  mkl::block_publish_flag(mkl::word_at(sync, mkl::single_off(mkl::W_ATTN_RELEASE)), epoch, true, tid);
}

// Every O-projection worker: poll ATTN_RELEASE, then read the merged attention.
__global__ void mkl_static_attn_wait(uint32_t* sync, const float* attn_out, float* out, int words, uint32_t epoch) {
  const unsigned tid = MKL_TID;
  if (tid == 0) {
    while (mkl::poll_acquire(mkl::word_at(sync, mkl::single_off(mkl::W_ATTN_RELEASE))) < epoch) {
    }
  }
  __syncthreads();
  for (int i = (int)tid; i < words; i += kThreads) out[i] = attn_out[i] * 2.f;
}

// Attention chunk of step_b0 (MKL_CAMPAIGN_STEP 2, production until round 8, a gate candidate
// since): the block that completes the chunk count merges every chunk's partials and releases
// the result.
__global__ void mkl_static_chunk_last_merges(uint32_t* sync, float* partials, float* attn_out, int chunks, int words,
                                             uint32_t epoch) {
  __shared__ uint32_t s_word;
  const unsigned tid = MKL_TID, c = MKL_BID;
  for (int i = (int)tid; i < words; i += kThreads) partials[(long long)c * words + i] = (float)(i ^ (int)epoch);
  const uint32_t old =
      mkl::block_arrive(mkl::word_at(sync, mkl::single_off(mkl::W_CHUNK_CTR)), kPartialRelease, tid, &s_word);
  if (old + 1 != (uint32_t)chunks * epoch) return;
  if (kPartialRelease) mkl::acquire_fence();
  for (int i = (int)tid; i < words; i += kThreads) {
    float acc = 0.f;
    for (int k = 0; k < chunks; ++k) acc += partials[(long long)k * words + i];
    attn_out[i] = acc;
  }
  mkl::block_publish_flag(mkl::word_at(sync, mkl::single_off(mkl::W_ATTN_RELEASE)), epoch, true, tid);
}

// Router / top-k: the whole block writes the routing payload, the leader the ids and
// weights; then the routing flag.
__global__ void mkl_static_topk(uint32_t* sync, float* hn, int* ids, float* weights, int d, uint32_t epoch) {
  const unsigned tid = MKL_TID;
  for (int i = (int)tid; i < d; i += kThreads) hn[i] = (float)i * 0.5f;
  if (tid == 0) {
    ids[0] = (int)epoch;
    weights[0] = 1.f;
  }
  mkl::block_publish_flag(mkl::word_at(sync, mkl::single_off(mkl::W_ROUTING)), epoch, kRoutingRelease, tid);
}

// Every worker: poll the routing flag, then read the routing payload.
__global__ void mkl_static_routing_wait(uint32_t* sync, const float* hn, const int* ids, float* out, int d,
                                        uint32_t epoch) {
  __shared__ int s_expert;
  const unsigned tid = MKL_TID;
  if (tid == 0) {
    while (mkl::poll_acquire(mkl::word_at(sync, mkl::single_off(mkl::W_ROUTING))) < epoch) {
    }
    s_expert = ids[0];
  }
  __syncthreads();
  for (int i = (int)tid; i < d; i += kThreads) out[i] = hn[i] + (float)s_expert;
}

// Expert W13 tile: write this tile's SwiGLU outputs, arrive at the expert's counter; the last
// of `tiles` arrivals fans the epoch out to the expert's release flags.
__global__ void mkl_static_w13(uint32_t* sync, float* swiglu, int expert, int tiles, int words, uint32_t epoch) {
  __shared__ uint32_t s_word;
  const unsigned tid = MKL_TID, t = MKL_BID;
  for (int i = (int)tid; i < words; i += kThreads) swiglu[(long long)t * words + i] = (float)(i + (int)epoch);
  const uint32_t old =
      mkl::block_arrive(mkl::word_at(sync, mkl::moe_counter_off(expert, kStride)), true, tid, &s_word);
  if ((old + 1) % (uint32_t)tiles != 0) return;
  mkl::acquire_fence();
  if (tid == 0) mkl::release_fanout(sync, expert, kStride, epoch);
}

// Expert W2 tile: poll this worker's release flag of the expert, then read the W13 output.
__global__ void mkl_static_w2(uint32_t* sync, const float* swiglu, float* out, int expert, int words,
                              uint32_t epoch) {
  const unsigned tid = MKL_TID, w = MKL_BID;
  if (tid == 0) {
    uint32_t* flag = mkl::word_at(sync, mkl::moe_release_off(expert, (int)(w % mkl::RELEASE_FANOUT), kStride));
    while (mkl::poll_acquire(flag) < epoch) {
    }
  }
  __syncthreads();
  for (int i = (int)tid; i < words; i += kThreads) out[(long long)w * words + i] = swiglu[i] * 2.f;
}
