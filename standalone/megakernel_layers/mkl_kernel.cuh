// mkl_kernel.cuh -- the layered MoE decode megakernel (CUDA, sm_90a): one launch runs one
// decode step through every layer; workers are persistent blocks that schedule themselves
// by rank and hand data to each other through mkl_sync.cuh.
//
// Per layer, each worker w (block w of G) does, in this order, whatever the schedule
// (mkl_model.h) gives it, waiting only where it consumes another worker's output:
//   QKV        tiles t = w, w+G, ... < QT: wait LAYER_END (all W2 rows of the previous
//              layer), RMSNorm, QKV rows -> q buffer / the new token's K,V cache row.
//   chunk      c = w if w < C: wait QKV_EPOCH, attend over tokens [c*S/C, (c+1)*S/C) for
//              every head, write (m, l, acc) partials, arrive at CHUNK; the last arriver
//              merges the C partials (LSE merge) and publishes ATTN_RELEASE.
//   O-proj     rows of D split over all workers: wait ATTN_RELEASE, h = x + Wo attn, arrive
//              at OPROJ; the last arriver runs RMSNorm + router + top-k and publishes ROUTING.
//   W13        wait ROUTING; tile (j, t): SwiGLU channels of selected expert j, arrive at the
//              expert's counter; the last of T13 arrivals fans the epoch out to its releases.
//   W2         rows of D: wait the releases of every selected expert, quantize their SwiGLU
//              outputs to FP8 (amax reduction per 32, scale per 128), x = h + sum_j w_j W2 a_j,
//              arrive at LAYER_END.
// Counters start at 0, bump once per layer and are never reset; what each barrier waits
// for is computed from (decode step, layer) -- the PR's fix -- and release flags sit on
// their own lines. Workers skew freely across layers: only those waits bind them.
// Before each wait a worker issues bulk L2 prefetches of the weights (or K/V) it reads
// next, so the copy overlaps the wait (the seed's DMA-before-poll).
//
// The ten hazard switches (Params::hazard, mkl::Hazard) each restore one mechanism of the
// MI355 PR at the place it lived; see docs/megakernel-layers.md for the table.
//
// Tripwire: the kernel is a template on TW; the TW=true instance writes breadcrumbs
// (hz_tripwire.h) from every block's leader: a position mark per task, and every
// inter-block wait publishes (barrier, observed, expected) plus, in aux words, the arrival
// counter that feeds it and the expert it waits for.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "../common/check.cuh"
#include "../include/hz_tripwire.h"
#include "megakernel_layers_names.h"
#include "mkl_model.h"
#include "mkl_sync.cuh"

namespace mkl {

constexpr int THREADS = 512;
constexpr int NWARPS = THREADS / 32;
constexpr int GEMV_ROWS = 4;         // rows per work item (loads in flight per lane: 4 x unroll 2)
constexpr int GEMV_MAX_ITEMS = 128;  // work items per reduction round of the block GEMV
constexpr int MERGE_BATCH = 16;      // chunk partials weighed per pass of the merge
constexpr int MERGE_OUT = 8;         // merged outputs per thread (NQ * HD <= THREADS * MERGE_OUT)
// Bulk L2 prefetch windows per worker (bytes), sized so that all workers together stay well
// inside the 60 MB L2: a whole-tile prefetch of the MoE phases (133 + 66 MB per layer) would
// evict itself before the loads arrive.
constexpr long long PREFETCH_W13 = 256 << 10;
constexpr long long PREFETCH_W2 = 64 << 10;

struct Params {
  Shape s;
  int L, seq, S, C, G, QT, T13, n_rows;
  int step;          // decode step index of this launch (epochs derive from it)
  int hazard;
  int jitter_ppm;    // chance per worker and layer boundary of a delay
  long long jitter_cycles;
  int writeback_ppm; // emulated L2 write-back of the expert barrier's line (AMD mechanism)
  int gemv_depth;    // GEMV loop iterations whose loads are issued ahead (1: as measured; 4)
  uint64_t seed;     // per launch: jitter and write-back draws
  const float* x_in;        // (D) input hidden state, packed by the host
  float* xres;              // (D) residual stream after each layer; the output
  float* qbuf;              // (NQ*HD) this layer's queries
  float* partials;          // (G, NQ, 2 + HD): m, l, acc of each chunk
  float* attn_out;          // (NQ*HD) merged attention
  float* h;                 // (D) after attention
  float* hn;                // (D) normalized h: the routing payload
  int* routing_ids;         // (K)
  float* routing_w;         // (K)
  float* swiglu;            // (K, I)
  const unsigned long long* ml_table;  // (L, N_SLOTS) per-layer descriptor table
  uint32_t* sync;           // the sync arena (mkl_sync.cuh)
};

// Shared memory: the descriptor, routing, reduction scratch, then one float arena.
struct SmemHead {
  unsigned long long desc[N_SLOTS];
  hz_tw_ctx tw;          // the leader's tripwire handle (only thread 0 touches it)
  int ids[16];
  float wts[16];
  float red[NWARPS * 2];
  float gemv[GEMV_MAX_ITEMS * GEMV_ROWS];  // the block GEMV's partial sums
  uint32_t word;
  int flag;
  uint32_t stuck_layer;  // HZ_STALE_RELEASE: written once at entry, never advanced
};
__host__ __device__ inline size_t arena_floats(const Shape& s) {
  const size_t act = (size_t)s.K * s.I > (size_t)s.D ? (size_t)s.K * s.I : (size_t)s.D;
  const size_t attn = (size_t)s.NQ * HD + (size_t)NWARPS * (s.NQ / s.NKV) * (HD + 2);
  const size_t oproj = (size_t)s.NQ * HD;
  size_t m = act > attn ? act : attn;
  m = m > oproj ? m : oproj;
  return m + 64;  // + router logits
}
__host__ __device__ inline size_t smem_bytes(const Shape& s) {
  return ((sizeof(SmemHead) + 15) / 16) * 16 + arena_floats(s) * sizeof(float);
}

// ---- loads ------------------------------------------------------------------------------

// Weights are never written during a launch: the read-only path, no L1 allocation.
__device__ __forceinline__ uint4 ld_weights(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// K/V rows (the new token's row is written in this launch): coherent L2 loads.
__device__ __forceinline__ uint4 ld_l2(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float dot8(const uint4 w, const float4 a, const float4 b) {
  float s = bf_lo(w.x) * a.x;
  s = fmaf(bf_hi(w.x), a.y, s);
  s = fmaf(bf_lo(w.y), a.z, s);
  s = fmaf(bf_hi(w.y), a.w, s);
  s = fmaf(bf_lo(w.z), b.x, s);
  s = fmaf(bf_hi(w.z), b.y, s);
  s = fmaf(bf_lo(w.w), b.z, s);
  s = fmaf(bf_hi(w.w), b.w, s);
  return s;
}

// Bulk L2 prefetch of [p, p + bytes) by warp `warp_id` (16-B aligned, multiple of 16).
__device__ __forceinline__ void prefetch_l2(const void* p, long long bytes) {
  const int lane = threadIdx.x & 31;
  constexpr long long PIECE = 16384;
  const char* c = static_cast<const char*>(p);
  for (long long off = (long long)lane * PIECE; off < bytes; off += 32 * PIECE) {
    const long long n = bytes - off < PIECE ? bytes - off : PIECE;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(c + off), "r"((uint32_t)n) : "memory");
  }
}

__device__ __forceinline__ void prefetch_l2_head(const void* p, long long bytes, long long window) {
  prefetch_l2(p, bytes < window ? bytes : window);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (every thread gets it); uses hd->red.
__device__ __forceinline__ float block_sum(float v, SmemHead* hd) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) hd->red[warp] = v;
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < NWARPS; ++i) t += hd->red[i];
  return t;
}

// ---- GEMV: out rows = W[rows] . act, bf16 weights, fp32 activations and accumulation -----
//
// Block-wide (every thread calls it). `nseg` segments of `seg_len` columns: row r reads
// base[s] + r * row_stride for segment s against act[s * seg_len ...] (the W2 phase sums its
// experts that way). Work items are (group of GEMV_ROWS rows, segment, column part): the
// columns are split when there are too few row groups to keep every warp streaming (the
// O-projection and W2 give a worker ~22 rows). A row past r1 is clamped to r1 - 1 (loaded and
// discarded) so the loads never branch. Each warp leaves its item's partial sums in smem;
// thread g then adds its group's parts in a fixed order (deterministic) and calls
// emit(first row, acc[GEMV_ROWS], valid rows).
template <int DEPTH, typename Emit>
__device__ __forceinline__ void gemv_block(const __nv_bfloat16* const* base, int nseg, long long row_stride,
                                           int seg_len, const float* act, int r0, int r1, float* red, Emit emit) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nchunk = seg_len >> 3;
  const int ngroups = (r1 - r0 + GEMV_ROWS - 1) / GEMV_ROWS;
  if (ngroups <= 0) return;
  int kparts = 1;
  while (ngroups * nseg * kparts < 2 * NWARPS && nchunk / (kparts * 2) >= 32) kparts *= 2;
  const int per_part = (nchunk + kparts - 1) / kparts;
  const int ipg = nseg * kparts;                     // items per group (<= 32: nseg <= 16)
  const int gpb = max(1, GEMV_MAX_ITEMS / ipg);      // groups per round
  for (int g0 = 0; g0 < ngroups; g0 += gpb) {
    const int gn = min(gpb, ngroups - g0);
    for (int it = warp; it < gn * ipg; it += NWARPS) {
      const int g = g0 + it / ipg, rest = it % ipg, sg = rest / kparts, kp = rest % kparts;
      const int rb = r0 + g * GEMV_ROWS;
      const __nv_bfloat16* rows[GEMV_ROWS];
#pragma unroll
      for (int j = 0; j < GEMV_ROWS; ++j) rows[j] = base[sg] + (long long)min(rb + j, r1 - 1) * row_stride;
      const float* a = act + (long long)sg * seg_len;
      float acc[GEMV_ROWS];
#pragma unroll
      for (int j = 0; j < GEMV_ROWS; ++j) acc[j] = 0.f;
      const int c1 = min(nchunk, (kp + 1) * per_part);
      // DEPTH iterations' loads are issued before any of them is consumed (a chunk past c1 is
      // clamped, loaded and discarded); the sums run in the same order for every DEPTH, so
      // every depth gives the same bits. DEPTH 1 is what GPU round 2 measured: nvcc then
      // keeps one iteration (4 x 16 B per lane) in flight, which leaves the GEMVs
      // latency-bound (docs/results/megakernel-layers-h200.md).
      for (int c = kp * per_part + lane; c < c1; c += 32 * DEPTH) {
        uint4 w[DEPTH][GEMV_ROWS];
#pragma unroll
        for (int u = 0; u < DEPTH; ++u) {
          const int cu = min(c + 32 * u, c1 - 1);
#pragma unroll
          for (int j = 0; j < GEMV_ROWS; ++j) w[u][j] = ld_weights(rows[j] + 8 * cu);
        }
#pragma unroll
        for (int u = 0; u < DEPTH; ++u) {
          const int cu = c + 32 * u;
          if (cu < c1) {
            const float4 a0 = *reinterpret_cast<const float4*>(a + 8 * cu);
            const float4 a1 = *reinterpret_cast<const float4*>(a + 8 * cu + 4);
#pragma unroll
            for (int j = 0; j < GEMV_ROWS; ++j) acc[j] += dot8(w[u][j], a0, a1);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < GEMV_ROWS; ++j) acc[j] = warp_sum(acc[j]);
      if (lane == 0)
#pragma unroll
        for (int j = 0; j < GEMV_ROWS; ++j) red[it * GEMV_ROWS + j] = acc[j];
    }
    __syncthreads();
    for (int gl = threadIdx.x; gl < gn; gl += THREADS) {
      float a[GEMV_ROWS];
#pragma unroll
      for (int j = 0; j < GEMV_ROWS; ++j) a[j] = 0.f;
      for (int i = 0; i < ipg; ++i)
#pragma unroll
        for (int j = 0; j < GEMV_ROWS; ++j) a[j] += red[(gl * ipg + i) * GEMV_ROWS + j];
      const int rb = r0 + (g0 + gl) * GEMV_ROWS;
      emit(rb, a, min(GEMV_ROWS, r1 - rb));
    }
    __syncthreads();
  }
}

// The block GEMV at the request's load depth (Params::gemv_depth: 1 or 4).
#define MKL_GEMV(...) \
  do {                 \
    if (p.gemv_depth >= 4) gemv_block<4>(__VA_ARGS__); \
    else gemv_block<1>(__VA_ARGS__);                   \
  } while (0)

// ---- tripwire helpers (only the TW=true instance stores anything) -------------------------

template <bool TW>
__device__ __forceinline__ void tw_mark(hz_tw_ctx* tw, int layer, int phase, int tile) {
  if (TW && threadIdx.x == 0) hz_tw_mark(tw, (uint32_t)layer, (uint32_t)phase, (uint32_t)tile);
}

// The leader waits until *flag >= want (acquire). While it waits it publishes the watch
// every HZ_TW_SPIN_STRIDE polls and, beside it, the arrival counter that feeds the flag
// (aux0: its value, aux1: what completes it, aux2: the expert or -1).
template <bool TW>
__device__ __forceinline__ uint32_t wait_ge(hz_tw_ctx* tw, const uint32_t* flag, uint32_t want, uint32_t bar,
                                            const uint32_t* feeder, uint32_t feeder_want, int expert) {
  uint32_t obs = poll_acquire(flag);
  if (obs >= want) return obs;
  do {
    if (TW) {
      hz_tw_poll(tw, bar, obs, want);
      if ((tw->spins & (HZ_TW_SPIN_STRIDE - 1u)) == 0u) {
        hz_tw_aux(tw, 0, feeder ? (uint64_t)load_relaxed(feeder) : ~0ull);
        hz_tw_aux(tw, 1, feeder_want);
        hz_tw_aux(tw, 2, (uint64_t)(int64_t)expert);
      }
    }
    obs = poll_acquire(flag);
  } while (obs < want);
  if (TW) hz_tw_passed(tw, bar, obs, want);
  return obs;
}

__device__ __forceinline__ uint32_t* sync_word(const Params& p, int w) { return word_at(p.sync, single_off(w)); }

// Refresh the task descriptor from this layer's row of the table. HZ_STALE_DESCRIPTOR copies
// only the slots of the plain task (the seed's first 24 of 28): W2 and the KV cache keep
// layer 0's pointers.
__device__ __forceinline__ void refresh_desc(const Params& p, SmemHead* hd, int layer) {
  const int n = (p.hazard == HZ_STALE_DESCRIPTOR && layer > 0) ? PLAIN_SLOTS : N_SLOTS;
  if (threadIdx.x < n) hd->desc[threadIdx.x] = p.ml_table[(size_t)layer * N_SLOTS + threadIdx.x];
}

template <typename T>
__device__ __forceinline__ const T* dptr(const SmemHead* hd, int slot) {
  return reinterpret_cast<const T*>(hd->desc[slot]);
}

// ---- phases -----------------------------------------------------------------------------

// act <- RMSNorm(x) * w over D (every thread).
__device__ __forceinline__ void rmsnorm_to(const float* x, const float* w, float* act, int D, SmemHead* hd) {
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += THREADS) {
    const float v = x[i];
    act[i] = v;
    ss += v * v;
  }
  const float total = block_sum(ss, hd);
  const float rs = rsqrtf(total / (float)D + RMS_EPS);
  for (int i = threadIdx.x; i < D; i += THREADS) act[i] = act[i] * rs * w[i];
  __syncthreads();
}

// One attention chunk for every head: tokens [t0, t1) of this layer's cache (row seq is the
// new token). Warps: kv head = warp % NKV, token lane-blocks interleaved over the
// NWARPS / NKV warps of a head; lane = token for the scores, lane = dim pair for P.V.
// Writes the chunk's (m, l, acc) per q head into `part` (NQ x (2 + HD)).
__device__ void attend_chunk(const Params& p, const SmemHead* hd, float* arena, int t0, int t1, float* part) {
  const Shape& s = p.s;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int GQ = s.NQ / s.NKV, wpk = NWARPS / s.NKV;
  const int kvh = warp % s.NKV, sub = warp / s.NKV;
  float* q = arena;                          // (NQ, HD)
  float* scratch = arena + s.NQ * HD;        // (NWARPS, GQ, 2 + HD)
  for (int i = threadIdx.x; i < s.NQ * HD; i += THREADS) q[i] = p.qbuf[i];
  __syncthreads();
  const __nv_bfloat16* kc = dptr<__nv_bfloat16>(hd, SLOT_KCACHE);
  const __nv_bfloat16* vc = dptr<__nv_bfloat16>(hd, SLOT_VCACHE);
  constexpr float scale = 0.125f;  // 1/sqrt(64)
  float m[8], l[8], acc[8][2];
#pragma unroll
  for (int g = 0; g < 8; ++g) { m[g] = -INFINITY; l[g] = 0.f; acc[g][0] = acc[g][1] = 0.f; }
  for (int base = t0 + 32 * sub; base < t1; base += 32 * wpk) {
    const int tok = base + lane;
    const bool valid = tok < t1;
    float sc[8];
#pragma unroll
    for (int g = 0; g < 8; ++g) sc[g] = 0.f;
    const __nv_bfloat16* krow = kc + ((size_t)(valid ? tok : base) * s.NKV + kvh) * HD;
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // half a K row at a time: fewer live registers
      uint4 kr[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) kr[i] = ld_l2(krow + 32 * half + 8 * i);
#pragma unroll
      for (int g = 0; g < 8; ++g) {
        if (g >= GQ) break;
        const float* qg = q + (kvh * GQ + g) * HD + 32 * half;
#pragma unroll
        for (int i = 0; i < 4; ++i)
          sc[g] += dot8(kr[i], *reinterpret_cast<const float4*>(qg + 8 * i), *reinterpret_cast<const float4*>(qg + 8 * i + 4));
      }
    }
#pragma unroll
    for (int g = 0; g < 8; ++g) sc[g] = valid ? sc[g] * scale : -INFINITY;
    float pr[8];
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      if (g >= GQ) break;
      const float mx = warp_max(sc[g]);  // finite: lane 0's token is valid
      const float mn = fmaxf(m[g], mx);
      const float alpha = expf(m[g] - mn);  // m = -inf -> 0
      pr[g] = valid ? expf(sc[g] - mn) : 0.f;
      l[g] = l[g] * alpha + pr[g];
      acc[g][0] *= alpha;
      acc[g][1] *= alpha;
      m[g] = mn;
    }
    const int ntok = min(32, t1 - base);
    for (int t = 0; t < ntok; ++t) {
      const uint32_t vv = __ldcg(reinterpret_cast<const unsigned int*>(vc + ((size_t)(base + t) * s.NKV + kvh) * HD) + lane);
      const float v0 = bf_lo(vv), v1 = bf_hi(vv);
#pragma unroll
      for (int g = 0; g < 8; ++g) {
        if (g >= GQ) break;
        const float pg = __shfl_sync(0xffffffffu, pr[g], t);
        acc[g][0] = fmaf(pg, v0, acc[g][0]);
        acc[g][1] = fmaf(pg, v1, acc[g][1]);
      }
    }
  }
  // this warp's (m, l, acc) per head into scratch, then combine the warps of each head
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    if (g >= GQ) break;
    const float lt = warp_sum(l[g]);
    float* sw = scratch + ((size_t)warp * GQ + g) * (2 + HD);
    if (lane == 0) { sw[0] = m[g]; sw[1] = lt; }
    sw[2 + 2 * lane] = acc[g][0];
    sw[2 + 2 * lane + 1] = acc[g][1];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < s.NQ * (HD + 2); idx += THREADS) {
    const int n = idx / (HD + 2), k = idx % (HD + 2);
    const int h = n / GQ, g = n % GQ;
    float M = -INFINITY;
    for (int u = 0; u < wpk; ++u) M = fmaxf(M, scratch[((size_t)(u * s.NKV + h) * GQ + g) * (2 + HD)]);
    float v = 0.f;
    if (k == 0) {
      v = M;
    } else {
      for (int u = 0; u < wpk; ++u) {
        const float* sw = scratch + ((size_t)(u * s.NKV + h) * GQ + g) * (2 + HD);
        const float wgt = sw[0] == -INFINITY ? 0.f : expf(sw[0] - M);
        v += wgt * sw[k];
      }
    }
    part[(size_t)n * (2 + HD) + k] = v;  // k = 0: m, 1: l, 2..: acc
  }
}

// LSE merge of C chunk partials into attn_out (the last chunk arriver), MERGE_BATCH chunks
// a pass: their (m, l) land in smem, each head's running max / sum and rescale factor are
// updated there, then every thread weighs its MERGE_OUT outputs with the batch's partials,
// issuing the batch's loads together (one dependent L2 load at a time would make the merge
// latency-bound). Plain loads: what they see depends on the acquire before them
// (HZ_PARTIAL_NO_FENCE drops it).
__device__ void merge_chunks(const Params& p, float* arena) {
  const Shape& s = p.s;
  const int NQ = s.NQ, W = 2 + HD, tid = threadIdx.x;
  float* ml = arena;                        // (MERGE_BATCH, NQ, 2)
  float* wts = ml + MERGE_BATCH * NQ * 2;   // (MERGE_BATCH, NQ)
  float* run_m = wts + MERGE_BATCH * NQ;    // (NQ) running max
  float* run_l = run_m + NQ;                // (NQ) running sum
  float* alpha = run_l + NQ;                // (NQ) rescale of this pass
  float acc[MERGE_OUT];
#pragma unroll
  for (int r = 0; r < MERGE_OUT; ++r) acc[r] = 0.f;
  for (int n = tid; n < NQ; n += THREADS) { run_m[n] = -INFINITY; run_l[n] = 0.f; }
  for (int cb = 0; cb < p.C; cb += MERGE_BATCH) {
    const int cnt = min(MERGE_BATCH, p.C - cb);
    for (int i = tid; i < cnt * NQ; i += THREADS) {
      const float* pc = p.partials + ((size_t)cb * NQ + i) * W;  // chunk cb + i / NQ, head i % NQ
      ml[2 * i] = pc[0];
      ml[2 * i + 1] = pc[1];
    }
    __syncthreads();
    for (int n = tid; n < NQ; n += THREADS) {
      const float m_old = run_m[n];
      float mn = m_old;
      for (int b = 0; b < cnt; ++b) mn = fmaxf(mn, ml[2 * (b * NQ + n)]);
      const float al = m_old == -INFINITY ? 0.f : expf(m_old - mn);
      float l = run_l[n] * al;
      for (int b = 0; b < cnt; ++b) {
        const float mb = ml[2 * (b * NQ + n)];
        const float wb = mb == -INFINITY ? 0.f : expf(mb - mn);
        wts[b * NQ + n] = wb;
        l += wb * ml[2 * (b * NQ + n) + 1];
      }
      run_m[n] = mn;
      run_l[n] = l;
      alpha[n] = al;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < MERGE_OUT; ++r) {
      const int idx = tid + r * THREADS;
      if (idx < NQ * HD) {
        const int n = idx / HD, d = idx % HD;
        float v[MERGE_BATCH];
#pragma unroll
        for (int b = 0; b < MERGE_BATCH; ++b)
          v[b] = b < cnt ? p.partials[((size_t)(cb + b) * NQ + n) * W + 2 + d] : 0.f;
        float a = acc[r] * alpha[n];
#pragma unroll
        for (int b = 0; b < MERGE_BATCH; ++b)
          if (b < cnt) a = fmaf(wts[b * NQ + n], v[b], a);
        acc[r] = a;
      }
    }
    __syncthreads();  // the next pass rewrites ml / wts / alpha
  }
#pragma unroll
  for (int r = 0; r < MERGE_OUT; ++r) {
    const int idx = tid + r * THREADS;
    if (idx < NQ * HD) p.attn_out[idx] = acc[r] / run_l[idx / HD];
  }
}

// Router + top-k + softmax by the last O-projection arriver; publishes ROUTING.
__device__ void router_topk(const Params& p, SmemHead* hd, float* arena, uint32_t epoch) {
  const Shape& s = p.s;
  float* hn = arena;
  float* logits = arena + s.D;
  rmsnorm_to(p.h, dptr<float>(hd, SLOT_MLP_NORM), hn, s.D, hd);
  for (int i = threadIdx.x; i < s.D; i += THREADS) p.hn[i] = hn[i];  // the payload
  const __nv_bfloat16* wr = dptr<__nv_bfloat16>(hd, SLOT_ROUTER);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int e = warp; e < s.E; e += NWARPS) {
    float a = 0.f;
    for (int c = lane; c < (s.D >> 3); c += 32)
      a += dot8(ld_weights(wr + (size_t)e * s.D + 8 * c), *reinterpret_cast<const float4*>(hn + 8 * c),
                *reinterpret_cast<const float4*>(hn + 8 * c + 4));
    a = warp_sum(a);
    if (lane == 0) logits[e] = a;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long taken = 0ull;  // E <= 64
    float sel[16];
    for (int j = 0; j < s.K; ++j) {  // largest first, ties to the lower index
      int best = -1;
      for (int e = 0; e < s.E; ++e)
        if (!(taken >> e & 1ull) && (best < 0 || logits[e] > logits[best])) best = e;
      taken |= 1ull << best;
      sel[j] = logits[best];
      p.routing_ids[j] = best;
    }
    float den = 0.f;
    for (int j = 0; j < s.K; ++j) den += expf(sel[j] - sel[0]);
    for (int j = 0; j < s.K; ++j) p.routing_w[j] = expf(sel[j] - sel[0]) / den;
  }
  block_publish_flag(sync_word(p, W_ROUTING), epoch, p.hazard != HZ_ROUTING_NO_FENCE, threadIdx.x);
}

// Quantize expert slot j's SwiGLU output to E4M3, one power-of-two scale per 128 elements,
// and write it dequantized and multiplied by the routing weight into act (one warp).
// Lane = sub-block of 32 elements; rounds of 32 sub-blocks; the super-block amax of 4 lanes
// comes from a butterfly. `reg` is one register reused per round: it holds the lane's amax
// bits, then the last word of its packed codes. With HZ_AMAX_TAIL a lane whose sub-block
// lies past the end keeps last round's packed codes in `reg` and the butterfly reads them as
// an amax (the seed: "shuffled from two lanes whose loop condition had failed and whose
// amax register was never written"); fixed: the partner index is clamped to the last
// sub-block that ran.
__device__ void quantize_expert_input(const float* src, float* dst, float wgt, int I, bool broken_tail) {
  const int lane = threadIdx.x & 31;
  const int nsub = I / SUB_BLOCK;
  uint32_t reg = 0u;
  for (int r0 = 0; r0 < nsub; r0 += 32) {
    const int sb = r0 + lane;
    const bool ran = sb < nsub;
    const int last_lane = min(31, nsub - 1 - r0);
    float v[SUB_BLOCK];
    if (ran) {
      float amax = 0.f;
#pragma unroll
      for (int i = 0; i < SUB_BLOCK; i += 4) {
        const float4 x = __ldcg(reinterpret_cast<const float4*>(src + sb * SUB_BLOCK + i));
        v[i] = x.x; v[i + 1] = x.y; v[i + 2] = x.z; v[i + 3] = x.w;
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w))));
      }
      reg = __float_as_uint(amax);
    }
    float m = __uint_as_float(reg);
#pragma unroll
    for (int k = 1; k < 4; k <<= 1) {
      const int partner = broken_tail ? (lane ^ k) : min(lane ^ k, last_lane);
      m = fmaxf(m, __shfl_sync(0xffffffffu, m, partner));
    }
    if (ran) {
      // scale = 2^e, the smallest power of two with amax / scale <= 448 (frexp: exact)
      int ex = 0;
      const float fr = frexpf(m / FP8_MAX, &ex);
      const float scale = m > 0.f ? ldexpf(1.f, fr == 0.5f ? ex - 1 : ex) : 1.f;
      const float inv = 1.f / scale;
#pragma unroll
      for (int i = 0; i < SUB_BLOCK; i += 4) {
        uint32_t packed = 0u;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const __nv_fp8_e4m3 q(v[i + k] * inv);
          packed |= (uint32_t)q.__x << (8 * k);
          dst[sb * SUB_BLOCK + i + k] = (float)q * scale * wgt;
        }
        reg = packed;
      }
    }
  }
}

// The W13 barrier of expert e fired; HZ_SHARED_LINE's lost release is AMD's, so on this
// GPU it is emulated: an L2 write-back of the counter's 64-B line, still holding the release
// values from before this barrier, lands on top of the write-through releases -- but only
// on the words that really share that line (computed from the layout, so the fixed layout
// is immune). Happens with probability writeback_ppm per release.
__device__ __forceinline__ void emulate_l2_writeback(const Params& p, int e, int stride, const uint32_t* line_image,
                                                     int layer) {
  if (p.writeback_ppm <= 0) return;
  const uint64_t h = hz::splitmix64(p.seed ^ ((uint64_t)e << 40) ^ ((uint64_t)layer << 20) ^ 0x5157ull);
  if (h % 1000000ull >= (uint64_t)p.writeback_ppm) return;
  for (int x = 0; x < RELEASE_FANOUT; ++x)
    if (release_shares_counter_line(x, stride)) store_write_through(word_at(p.sync, moe_release_off(e, x, stride)), line_image[x]);
}

// ---- the kernel ---------------------------------------------------------------------------

// With probability jitter_ppm, this worker's leader stalls jitter_cycles here (`site`: 0 the
// layer boundary, 1 before a W13 tile): workers skew freely, as in the PR's megakernel.
__device__ __forceinline__ void maybe_skew(const Params& p, int w, int layer, int site) {
  if (p.jitter_ppm > 0 && threadIdx.x == 0 &&
      hz::splitmix64(p.seed ^ ((uint64_t)w << 24) ^ ((uint64_t)layer << 4) ^ (uint64_t)site) % 1000000ull <
          (uint64_t)p.jitter_ppm)
    hz_spin_cycles(p.jitter_cycles);
  __syncthreads();
}

template <bool TW>
__global__ void __launch_bounds__(THREADS, 1) mkl_megakernel(const Params p, hz_tw_t tw_arg) {
  extern __shared__ __align__(16) char smem_raw[];
  SmemHead* hd = reinterpret_cast<SmemHead*>(smem_raw);
  float* arena = reinterpret_cast<float*>(smem_raw + ((sizeof(SmemHead) + 15) / 16) * 16);
  const Shape& s = p.s;
  const int w = blockIdx.x, tid = threadIdx.x;
  const int stride = release_stride(p.hazard);
  hz_tw_ctx* tw = &hd->tw;  // the leader's handle lives in smem: no register cost elsewhere
  if (tid == 0) {
    hd->tw = hz_tw_open(TW ? tw_arg : hz_tw_t{}, (uint32_t)w);
    hd->stuck_layer = 0u;  // HZ_STALE_RELEASE's slot: stored once, never advanced
  }
  if (tid < N_SLOTS) hd->desc[tid] = p.ml_table[tid];
  __syncthreads();
  tw_mark<TW>(tw, 0, HZ_TW_PHASE_START, 0);

  const int qkvr = qkv_rows(s);
  const int r0 = row_begin(w, p.n_rows, s.D), r1 = w < p.n_rows ? row_begin(w + 1, p.n_rows, s.D) : r0;
  const Schedule sc{p.G, p.QT, p.C, p.S, p.T13, p.n_rows};

  for (int l = 0; l < p.L; ++l) {
    const uint32_t epoch = epoch_of(p.step, p.L, l);
    refresh_desc(p, hd, l);
    // Expected values. Fixed: derived from (step, layer). HZ_SNAPSHOT_EPOCH: "counter + 1"
    // read at layer entry, valid only if this worker reads before the producer bumps.
    uint32_t attn_want = epoch, routing_want = epoch;
    if (p.hazard == HZ_SNAPSHOT_EPOCH && tid == 0) {
      attn_want = load_relaxed(sync_word(p, W_ATTN_RELEASE)) + 1u;
      routing_want = load_relaxed(sync_word(p, W_ROUTING)) + 1u;
    }
    const uint32_t w13_value =
        p.hazard == HZ_STALE_RELEASE ? epoch_of(p.step, p.L, (int)hd->stuck_layer) : epoch;
    __syncthreads();  // descriptor refreshed
    const float* xcur = l == 0 ? p.x_in : p.xres;

    // ---- QKV tiles -------------------------------------------------------------------------
    bool normed = false;
    for (int t = w; t < p.QT; t += p.G) {
      tw_mark<TW>(tw, l, PHASE_QKV, t);
      const int q0 = t * QKV_TILE_ROWS, q1 = min(q0 + QKV_TILE_ROWS, qkvr);
      const __nv_bfloat16* wq = dptr<__nv_bfloat16>(hd, SLOT_WQKV);
      if (tid < 32) prefetch_l2(wq + (size_t)q0 * s.D, (long long)(q1 - q0) * s.D * 2);
      if (!normed) {
        if (l > 0 && tid == 0)
          wait_ge<TW>(tw, sync_word(p, W_LAYER_CTR), (uint32_t)p.n_rows * (epoch - 1u), BAR_LAYER_END, nullptr, 0, -1);
        __syncthreads();
        rmsnorm_to(xcur, dptr<float>(hd, SLOT_ATTN_NORM), arena, s.D, hd);
        normed = true;
      }
      __nv_bfloat16* kc = const_cast<__nv_bfloat16*>(dptr<__nv_bfloat16>(hd, SLOT_KCACHE)) + (size_t)p.seq * s.NKV * HD;
      __nv_bfloat16* vc = const_cast<__nv_bfloat16*>(dptr<__nv_bfloat16>(hd, SLOT_VCACHE)) + (size_t)p.seq * s.NKV * HD;
      const int nq = s.NQ * HD, nk = s.NKV * HD;
      MKL_GEMV(&wq, 1, s.D, s.D, arena, q0, q1, hd->gemv, [&](int r, const float* a, int n) {
        for (int j = 0; j < n; ++j) {
          const int row = r + j;
          if (row < nq) p.qbuf[row] = a[j];
          else if (row < nq + nk) kc[row - nq] = __float2bfloat16_rn(a[j]);
          else vc[row - nq - nk] = __float2bfloat16_rn(a[j]);
        }
      });
      block_arrive(sync_word(p, W_QKV_CTR), true, tid, &hd->word);
    }

    // ---- attention chunk ------------------------------------------------------------------
    if (serves_chunk(w, sc, p.hazard)) {
      const int c = w;
      const int t0 = chunk_begin(c, p.C, p.S), t1 = chunk_begin(c + 1, p.C, p.S);
      tw_mark<TW>(tw, l, PHASE_ATTN_CHUNK, c);
      const long long row_bytes = (long long)s.NKV * HD * 2;
      if (tid < 32 && t1 > t0)
        prefetch_l2(dptr<__nv_bfloat16>(hd, SLOT_KCACHE) + (size_t)t0 * s.NKV * HD, (t1 - t0) * row_bytes);
      else if (tid >= 32 && tid < 64 && t1 > t0)
        prefetch_l2(dptr<__nv_bfloat16>(hd, SLOT_VCACHE) + (size_t)t0 * s.NKV * HD, (t1 - t0) * row_bytes);
      if (tid == 0)
        wait_ge<TW>(tw, sync_word(p, W_QKV_CTR), (uint32_t)p.QT * epoch, BAR_QKV_EPOCH, nullptr, 0, -1);
      __syncthreads();
      float* part = p.partials + (size_t)c * s.NQ * (2 + HD);
      if (t1 > t0) {
        attend_chunk(p, hd, arena, t0, t1, part);
      } else {  // an empty chunk stamps LSE = -inf
        for (int i = tid; i < s.NQ * (2 + HD); i += THREADS) part[i] = (i % (2 + HD)) == 0 ? -INFINITY : 0.f;
      }
      const bool fenced = p.hazard != HZ_PARTIAL_NO_FENCE;
      const uint32_t old = block_arrive(sync_word(p, W_CHUNK_CTR), fenced, tid, &hd->word);
      if (old + 1u == (uint32_t)p.C * epoch) {
        tw_mark<TW>(tw, l, PHASE_ATTN_MERGE, c);
        if (fenced) acquire_fence();
        merge_chunks(p, arena);
        block_publish_flag(sync_word(p, W_ATTN_RELEASE), epoch, true, tid);
      }
    }

    // ---- O-projection (+ router / top-k by the last arriver) ------------------------------
    if (r1 > r0) {
      tw_mark<TW>(tw, l, PHASE_OPROJ, w);
      const __nv_bfloat16* wo = dptr<__nv_bfloat16>(hd, SLOT_WO);
      const int ko = s.NQ * HD;
      if (tid < 32) prefetch_l2(wo + (size_t)r0 * ko, (long long)(r1 - r0) * ko * 2);
      else if (tid >= 32 && tid < 64 && w < s.E)  // the router's rows, for whichever worker runs top-k
        prefetch_l2(dptr<__nv_bfloat16>(hd, SLOT_ROUTER) + (size_t)w * s.D, (long long)s.D * 2);
      if (tid == 0)
        wait_ge<TW>(tw, sync_word(p, W_ATTN_RELEASE), attn_want, BAR_ATTN_RELEASE, sync_word(p, W_CHUNK_CTR),
                    (uint32_t)p.C * epoch, -1);
      __syncthreads();
      for (int i = tid; i < ko; i += THREADS) arena[i] = p.attn_out[i];
      __syncthreads();
      MKL_GEMV(&wo, 1, ko, ko, arena, r0, r1, hd->gemv, [&](int r, const float* a, int n) {
        for (int j = 0; j < n; ++j) p.h[r + j] = xcur[r + j] + a[j];
      });
      const uint32_t old = block_arrive(sync_word(p, W_OPROJ_CTR), true, tid, &hd->word);
      if (old + 1u == (uint32_t)p.n_rows * epoch) {
        tw_mark<TW>(tw, l, PHASE_ROUTER_TOPK, w);
        acquire_fence();
        router_topk(p, hd, arena, epoch);
      }
    }

    // ---- routing -----------------------------------------------------------------------------
    tw_mark<TW>(tw, l, PHASE_ROUTING_WAIT, 0);
    if (tid == 0)
      wait_ge<TW>(tw, sync_word(p, W_ROUTING), routing_want, BAR_ROUTING, sync_word(p, W_OPROJ_CTR),
                  (uint32_t)p.n_rows * epoch, -1);
    __syncthreads();
    if (tid < s.K) {
      hd->ids[tid] = p.routing_ids[tid];
      hd->wts[tid] = p.routing_w[tid];
    }
    __syncthreads();

    // ---- expert W13 tiles ------------------------------------------------------------------
    bool have_hn = false;
    for (int u = w; u < s.K * p.T13; u += p.G) {
      const int j = u / p.T13, t = u % p.T13, e = hd->ids[j];
      const int c0 = channel_begin(t, p.T13, s.I), c1 = channel_begin(t + 1, p.T13, s.I);
      const __nv_bfloat16* w13 = dptr<__nv_bfloat16>(hd, SLOT_W13) + (size_t)e * s.I * 2 * s.D;
      if (tid < 32) prefetch_l2_head(w13 + (size_t)2 * c0 * s.D, (long long)(c1 - c0) * 2 * s.D * 2, PREFETCH_W13);
      maybe_skew(p, w, l, 1);
      tw_mark<TW>(tw, l, PHASE_MOE_W13, u);
      if (!have_hn) {
        for (int i = tid; i < s.D; i += THREADS) arena[i] = p.hn[i];
        __syncthreads();
        have_hn = true;
      }
      float* out = p.swiglu + (size_t)j * s.I;
      MKL_GEMV(&w13, 1, s.D, s.D, arena, 2 * c0, 2 * c1, hd->gemv, [&](int r, const float* a, int n) {
        for (int k = 0; k + 1 < n; k += 2) {  // rows 2c (gate), 2c + 1 (up)
          const float g = a[k], up = a[k + 1];
          out[(r + k) >> 1] = g / (1.f + expf(-g)) * up;
        }
      });
      uint32_t* ctr = word_at(p.sync, moe_counter_off(e, stride));
      uint32_t line_image[RELEASE_FANOUT];
      if (tid == 0)  // what the counter's line holds in L2 before this arrival (emulation)
        for (int x = 0; x < RELEASE_FANOUT; ++x) line_image[x] = load_relaxed(word_at(p.sync, moe_release_off(e, x, stride)));
      const uint32_t old = block_arrive(ctr, true, tid, &hd->word);
      if ((old + 1u) % (uint32_t)p.T13 == 0u) {
        acquire_fence();
        if (tid == 0) {
          release_fanout(p.sync, e, stride, w13_value);
          emulate_l2_writeback(p, e, stride, line_image, l);
        }
      }
    }

    // ---- expert W2 rows ----------------------------------------------------------------------
    if (r1 > r0) {
      tw_mark<TW>(tw, l, PHASE_MOE_W2, w);
      const __nv_bfloat16* w2[16];
      for (int j = 0; j < s.K; ++j) w2[j] = dptr<__nv_bfloat16>(hd, SLOT_W2) + (size_t)hd->ids[j] * s.D * s.I;
      if (tid < 32)
        for (int j = 0; j < s.K; ++j)
          prefetch_l2_head(w2[j] + (size_t)r0 * s.I, (long long)(r1 - r0) * s.I * 2, PREFETCH_W2);
      if (tid == 0)
        for (int j = 0; j < s.K; ++j) {
          const int e = hd->ids[j];
          wait_ge<TW>(tw, word_at(p.sync, moe_release_off(e, w % RELEASE_FANOUT, stride)), w13_value, BAR_W13_W2,
                      word_at(p.sync, moe_counter_off(e, stride)), (uint32_t)p.T13, e);
        }
      __syncthreads();
      const int warp = tid >> 5;
      for (int j = warp; j < s.K; j += NWARPS)
        quantize_expert_input(p.swiglu + (size_t)j * s.I, arena + (size_t)j * s.I, hd->wts[j], s.I,
                              p.hazard == HZ_AMAX_TAIL);
      __syncthreads();
      MKL_GEMV(w2, s.K, s.I, s.I, arena, r0, r1, hd->gemv, [&](int r, const float* a, int n) {
        for (int j = 0; j < n; ++j) p.xres[r + j] = p.h[r + j] + a[j];
      });
      block_arrive(sync_word(p, W_LAYER_CTR), true, tid, &hd->word);
    }

    // ---- skew: workers drift apart across layer boundaries ----------------------------------
    if (l + 1 < p.L) maybe_skew(p, w, l, 0);
    __syncthreads();
  }
  tw_mark<TW>(tw, 0, HZ_TW_PHASE_DONE, 0);
}

}  // namespace mkl
