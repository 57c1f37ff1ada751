// mkl_model.h -- the model, its weights and the device-side schedule of the layered MoE
// decode megakernel, as plain functions shared by the kernel, the harness and (re-stated
// line by line) hazards/megakernel_layers/model.py and schedule.py.
//
// The model is a small GPT-OSS-shaped decoder layer stack, batch 1 (decode geometry M = 1):
// RMSNorm -> QKV (GQA, head dim 64) -> attention over the KV cache plus the new token ->
// O-projection + residual -> RMSNorm -> router top-k -> SwiGLU experts (W13 then W2, the
// expert input quantized to FP8 E4M3 with one power-of-two scale per 128 elements) +
// residual. No RoPE, biases, sinks or sliding window: they change no synchronisation.
//
// Weights are a hash of (tensor, index), so the torch reference regenerates exactly the
// same bf16 values without a file: value = ((hash >> 8) * 2^-24 - 0.5) * 2 * scale with a
// power-of-two scale, exact in fp32, then rounded to bf16 (RNE on both sides).
#pragma once
#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIP__)
#define MKL_HD __host__ __device__ __forceinline__
#else
#define MKL_HD inline
#endif

namespace mkl {

constexpr int HD = 64;              // head dim (fixed: one lane pair per dim pair in attention)
constexpr int PART_W = 2 + HD;      // floats of a chunk's partial per head: m, l, acc[HD]
// QKV output rows per tile (tile t -> worker rank t). Campaign step (j) (MKL_CAMPAIGN_STEP 12, a
// candidate; mkl_kernel.cuh says why): 40 rows, the fewest whole row groups of 4 (GEMV_ROWS) whose
// tiles fit 132 workers (128 tiles at the default shape, 39 at the small one). The host and the
// kernel read this one constant; hazards/megakernel_layers/model.py states it per build.
#if defined(MKL_CAMPAIGN_STEP) && MKL_CAMPAIGN_STEP == 12
constexpr int QKV_TILE_ROWS = 40;
#else
constexpr int QKV_TILE_ROWS = 64;
#endif
constexpr int FP8_BLOCK = 128;      // activation elements per FP8 scale
constexpr int SUB_BLOCK = 32;       // elements per lane in the amax reduction
constexpr float FP8_MAX = 448.f;    // largest finite E4M3 value
constexpr float RMS_EPS = 1e-5f;

struct Shape {
  int D, NQ, NKV, E, K, I;  // hidden, q heads, kv heads, experts, top-k, expert intermediate
};
// GPT-OSS-20B's layer shape (d_model 2880, 64 q / 8 kv heads of 64, 32 experts, top-4,
// intermediate 2880: 90 sub-blocks of 32, not a multiple of 4 -- the MI355 megakernel PR's W2 tail).
constexpr Shape SHAPE_DEFAULT = {2880, 64, 8, 32, 4, 2880};
// A small model for quick checks; its intermediate is a multiple of 128 (no amax tail).
constexpr Shape SHAPE_SMALL = {1024, 16, 4, 8, 2, 1024};

// The hazard switches, one per class of the MI355 PR (0: none).
enum Hazard : int {
  HZ_NONE = 0,
  HZ_PARTICIPANT_SET = 1,   // chunk phase nested inside the QKV rank guard
  HZ_CHUNK_SUPPLY = 2,      // more chunks than workers, host guard removed
  HZ_SNAPSHOT_EPOCH = 3,    // "+1" snapshot epochs read at layer entry
  HZ_STALE_RELEASE = 4,     // W13->W2 release value never advances
  HZ_SHARED_LINE = 5,       // release flags in the arrival counter's line (lost release)
  HZ_PARTIAL_NO_FENCE = 6,  // chunk partials published without release/acquire
  HZ_ROUTING_NO_FENCE = 7,  // routing flag written with no fence before it
  HZ_STALE_DESCRIPTOR = 8,  // task descriptor pointers not refreshed between layers
  HZ_AMAX_TAIL = 9,         // amax reduction tail reads lanes nobody wrote
  HZ_DEAD_FLAG = 10,        // host packs bf16 where the kernel reads fp32
  HZ_COUNT = 11,
};

// Per-layer task descriptor slots (the kernel refreshes them from a table every layer).
enum Slot : int {
  SLOT_ATTN_NORM = 0,
  SLOT_WQKV = 1,
  SLOT_WO = 2,
  SLOT_MLP_NORM = 3,
  SLOT_ROUTER = 4,
  SLOT_W13 = 5,
  SLOT_W2 = 6,
  SLOT_KCACHE = 7,
  SLOT_VCACHE = 8,
  N_SLOTS = 9,
  // what a refresh sized for the "plain" task copies (the MI355 megakernel PR's first 24 of 28 inputs)
  PLAIN_SLOTS = 6,
};

// Tensor ids for the weight hash.
enum Tensor : uint32_t {
  T_ATTN_NORM = 1, T_WQKV = 2, T_WO = 3, T_MLP_NORM = 4, T_ROUTER = 5, T_W13 = 6, T_W2 = 7,
  T_KCACHE = 8, T_VCACHE = 9, T_INPUT = 10,
};

// Value ranges (powers of two: the products stay exact in fp32).
constexpr float SCALE_W = 1.f / 32.f;   // every projection: unit-variance outputs for K ~ 3k
constexpr float SCALE_NORM = 0.25f;     // norm weights are 1 + uniform(+-0.25)
constexpr float SCALE_KCACHE = 4.f;     // peaked attention (scores of std ~2)
constexpr float SCALE_VCACHE = 1.f;
constexpr float SCALE_INPUT = 1.f;

MKL_HD uint32_t hash32(uint32_t x) {  // "lowbias32" (C. Wellons): a strong 32-bit mix
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

MKL_HD uint32_t tensor_key(uint32_t seed, uint32_t kind, uint32_t layer, uint32_t expert) {
  return hash32(seed * 0x9E3779B9u ^ hash32(kind * 0x85EBCA6Bu ^ hash32(layer * 0xC2B2AE35u ^ expert)));
}

// Uniform in [-scale, scale): 24 hash bits, exact in fp32 for a power-of-two scale.
MKL_HD float uniform_pm(uint32_t key, uint32_t idx, float scale) {
  const uint32_t h = hash32(idx * 0x9E3779B9u ^ key);
  const float u = (float)(h >> 8) * (1.0f / 16777216.0f);
  return (u - 0.5f) * (2.0f * scale);
}

// ---- the schedule: which worker does what (the Python schedule model states the same) ----

struct Schedule {
  int G;        // workers (persistent blocks)
  int QT;       // QKV tiles: tile t -> worker t % G
  int C;        // attention chunks: chunk c -> worker c (if that worker serves chunks)
  int S;        // tokens attended: seq + 1 (the cache plus the new token)
  int T13;      // W13 tiles per selected expert: tile (j, t) -> worker j * T13 + t (mod G)
  int n_rows;   // workers with O-projection / W2 rows (rows split evenly over them)
};

MKL_HD int qkv_rows(const Shape& s) { return (s.NQ + 2 * s.NKV) * HD; }
MKL_HD int qkv_tiles(const Shape& s) { return (qkv_rows(s) + QKV_TILE_ROWS - 1) / QKV_TILE_ROWS; }
MKL_HD int auto_chunks(int S, int chunk_tokens, int G) {  // scale with length, cap at workers
  const int c = (S + chunk_tokens - 1) / chunk_tokens;
  return c < 1 ? 1 : (c > G ? G : c);
}
MKL_HD int w13_tiles(int G, int K) { return G >= K ? G / K : 1; }
MKL_HD int row_workers(int G, int D) { return G < D ? G : D; }
// Rows [row_begin(w), row_begin(w + 1)) of D rows over n workers (worker w >= n: none).
MKL_HD int row_begin(int w, int n, int D) { return (int)(((long long)w * D) / n); }
// Tokens [chunk_begin(c), chunk_begin(c + 1)) of S tokens over C chunks (may be empty).
MKL_HD int chunk_begin(int c, int C, int S) { return (int)(((long long)c * S) / C); }
// Intermediate channels of W13 tile t of T13 (a contiguous range).
MKL_HD int channel_begin(int t, int T13, int I) { return (int)(((long long)t * I) / T13); }

// Does worker w serve attention chunk w this layer? The MI355 megakernel PR's bug nests the chunk phase
// inside the QKV rank guard: only workers that hold a QKV tile then reach it.
MKL_HD bool serves_chunk(int w, const Schedule& sc, int hazard) {
  if (w >= sc.C) return false;
  return hazard != HZ_PARTICIPANT_SET || w < sc.QT;
}

// Campaign step (d) (MKL_CAMPAIGN_STEP >= 5, in production since round 8: steps 5, 10, 14, 15, 21 and 22, whose step (t) splits a worker's heads; mkl_kernel.cuh): workers [0, merge_workers) each merge
// the attention heads w, w + merge_workers, ... (one a warp) once every chunk has arrived: as
// few workers as give every head a warp (4 at 64 heads). A head's merge is latency-bound, so
// more workers would not be faster; they would add arrivals to the merge counter, pollers of
// the chunk counter's line, and busy block-time (the perf gate's sumCTA: the same work on more
// blocks is what it calls sloughing). Only workers that hold a QKV tile (w < min(QT, G)) merge:
// every one of them already arrives (at QKV) before the merge can release, so the workers that
// arrive at nothing before ATTN_RELEASE is bumped -- the snapshot_epoch switch's vulnerable
// set -- are step 2's (the production before it).
// Step (t) (MKL_MERGE_SPLIT, in production since step 22; mkl_kernel.cuh's switch block says why) merges
// one head a block: its 16 warps split the head's chunks, so merge_workers is one worker a head (64 at
// the default shape, 16 at the small one), still QKV-tile holders only. This constant is the one place
// the count changes; hazards/megakernel_layers/model.py states it per build (merge_heads_per_worker).
// This header is read before mkl_kernel.cuh's switch block, so it spells the switch's default itself: on
// with -DMKL_MERGE_SPLIT=1, or without that -D at step 22 on (the default step, 22, when no
// -DMKL_CAMPAIGN_STEP is given); mkl_kernel.cuh static_asserts that the two agree.
#if (defined(MKL_MERGE_SPLIT) && MKL_MERGE_SPLIT) || \
    (!defined(MKL_MERGE_SPLIT) && (!defined(MKL_CAMPAIGN_STEP) || MKL_CAMPAIGN_STEP >= 22))
constexpr int MERGE_HEADS_PER_WORKER = 1;   // step (t): one a block (its warps split the chunks)
#else
constexpr int MERGE_HEADS_PER_WORKER = 16;  // one a warp of the kernel's 512-thread blocks
#endif
MKL_HD int merge_workers(int NQ, int QT, int G) {
  const int holders = QT < G ? QT : G;
  const int want = (NQ + MERGE_HEADS_PER_WORKER - 1) / MERGE_HEADS_PER_WORKER;
  return want < holders ? want : holders;
}

// The epoch of (decode step, layer): every counter starts at 0 and bumps once per layer,
// never reset, so the value each barrier reaches is a function of these two numbers.
MKL_HD uint32_t epoch_of(int step, int layers, int layer) {
  return (uint32_t)step * (uint32_t)layers + (uint32_t)layer + 1u;
}

}  // namespace mkl
