// mkl_reference.cuh -- the weights, and an independent unfused reference of the same decode
// step: one plain kernel per operation, launched layer by layer from the host, computed once
// per configuration and then compared with every megakernel launch on the device.
//
// Same weights (the hash of mkl_model.h), same precision as the megakernel (bf16 weights and
// KV cache, fp32 activations and accumulation, FP8 E4M3 expert input with one power-of-two
// scale per 128 elements), different code and reduction order. The torch reference
// (hazards/megakernel_layers/reference.py) is the same computation again; the GPU tests
// compare all three.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>

#include "mkl_model.h"

namespace mkl {

// ---- weights ----------------------------------------------------------------------------

__global__ void fill_bf16_kernel(__nv_bfloat16* p, size_t n, uint32_t key, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16_rn(uniform_pm(key, (uint32_t)i, scale));
}

__global__ void fill_f32_kernel(float* p, size_t n, uint32_t key, float scale, float offset) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = offset + uniform_pm(key, (uint32_t)i, scale);
}

// ---- reference operations -----------------------------------------------------------------

constexpr int REF_THREADS = 256;

__device__ __forceinline__ float ref_block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += red[i];
  return t;
}

// out = x * rsqrt(mean(x^2) + eps) * w  (one block)
__global__ void ref_rmsnorm(const float* x, const float* w, float* out, int D) {
  __shared__ float red[32];
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += x[i] * x[i];
  const float rs = rsqrtf(ref_block_sum(ss, red) / (float)D + RMS_EPS);
  for (int i = threadIdx.x; i < D; i += blockDim.x) out[i] = x[i] * rs * w[i];
}

// out[r] = sum_k W[r][k] x[k]  (one block per row)
__global__ void ref_gemv(const __nv_bfloat16* W, const float* x, float* out, int K) {
  __shared__ float red[32];
  const __nv_bfloat16* row = W + (size_t)blockIdx.x * K;
  float a = 0.f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) a += __bfloat162float(row[k]) * x[k];
  a = ref_block_sum(a, red);
  if (threadIdx.x == 0) out[blockIdx.x] = a;
}

// Attention for one q head per block over S = seq + 1 tokens: cache rows [0, seq) and the
// new token's bf16-rounded k/v (from this reference's own QKV output). scores: (NQ, S).
__global__ void ref_attention(const float* q, const __nv_bfloat16* kc, const __nv_bfloat16* vc, const float* kvnew,
                              float* scores, float* out, int NQ, int NKV, int seq) {
  __shared__ float red[32];
  const int n = blockIdx.x, kvh = n / (NQ / NKV), S = seq + 1;
  float* sc = scores + (size_t)n * S;
  const float* qn = q + (size_t)n * HD;
  float mx = -INFINITY;
  for (int t = threadIdx.x; t < S; t += blockDim.x) {
    float d = 0.f;
    for (int i = 0; i < HD; ++i) {
      const float k = t < seq ? __bfloat162float(kc[((size_t)t * NKV + kvh) * HD + i])
                              : __bfloat162float(__float2bfloat16_rn(kvnew[kvh * HD + i]));
      d += qn[i] * k;
    }
    sc[t] = d * 0.125f;
    mx = fmaxf(mx, sc[t]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  __shared__ float smax[32];
  if ((threadIdx.x & 31) == 0) smax[threadIdx.x >> 5] = mx;
  __syncthreads();
  float M = -INFINITY;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) M = fmaxf(M, smax[i]);
  float l = 0.f;
  for (int t = threadIdx.x; t < S; t += blockDim.x) {
    sc[t] = expf(sc[t] - M);
    l += sc[t];
  }
  const float L = ref_block_sum(l, red);  // its barriers also publish sc[] to the block
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float a = 0.f;
    for (int t = 0; t < S; ++t) {
      const float v = t < seq ? __bfloat162float(vc[((size_t)t * NKV + kvh) * HD + d])
                              : __bfloat162float(__float2bfloat16_rn(kvnew[NKV * HD + kvh * HD + d]));
      a += sc[t] * v;
    }
    out[(size_t)n * HD + d] = a / L;
  }
}

__global__ void ref_add(const float* a, const float* b, float* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = a[i] + b[i];
}

// top-k (largest first, ties to the lower index) and a softmax over the selected logits.
__global__ void ref_topk(const float* logits, int E, int K, int* ids, float* wts) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  float sel[16];
  unsigned long long taken = 0ull;
  for (int j = 0; j < K; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e)
      if (!(taken >> e & 1ull) && (best < 0 || logits[e] > logits[best])) best = e;
    taken |= 1ull << best;
    ids[j] = best;
    sel[j] = logits[best];
  }
  float den = 0.f;
  for (int j = 0; j < K; ++j) den += expf(sel[j] - sel[0]);
  for (int j = 0; j < K; ++j) wts[j] = expf(sel[j] - sel[0]) / den;
}

// gu: (2I) rows 2c = gate, 2c + 1 = up -> out[c] = silu(gate) * up
__global__ void ref_swiglu(const float* gu, float* out, int I) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < I; c += gridDim.x * blockDim.x) {
    const float g = gu[2 * c], u = gu[2 * c + 1];
    out[c] = g / (1.f + expf(-g)) * u;
  }
}

// FP8 E4M3 round trip, one power-of-two scale per 128 elements (one thread per block of
// 128; the last block may be shorter): the smallest 2^e with amax / 2^e <= 448.
__global__ void ref_quant(const float* x, float* out, int n) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  const int lo = b * FP8_BLOCK, hi = min(lo + FP8_BLOCK, n);
  if (lo >= n) return;
  float amax = 0.f;
  for (int i = lo; i < hi; ++i) amax = fmaxf(amax, fabsf(x[i]));
  int ex = 0;
  const float fr = frexpf(amax / FP8_MAX, &ex);
  const float scale = amax > 0.f ? ldexpf(1.f, fr == 0.5f ? ex - 1 : ex) : 1.f;
  for (int i = lo; i < hi; ++i) out[i] = (float)__nv_fp8_e4m3(x[i] / scale) * scale;
}

// x_next = h + sum_j w_j y_j  (y: K x D)
__global__ void ref_moe_combine(const float* h, const float* y, const float* wts, int K, int D, float* out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < D; i += gridDim.x * blockDim.x) {
    float a = 0.f;
    for (int j = 0; j < K; ++j) a += wts[j] * y[(size_t)j * D + i];
    out[i] = h[i] + a;
  }
}

}  // namespace mkl
