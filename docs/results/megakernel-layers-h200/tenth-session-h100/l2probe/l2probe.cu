// L2 residency and per-SM streaming probe (lead's experiment, tenth session).
// Q: 29.5 MB (a layer's QKV weights), M: 199 MB (a layer's W13 + W2). Times, with cudaEvents:
//  1. Q read cold by 80 / 128 / 132 blocks (is a streamed read paced per SM?)
//  2. Q read right after Q was read (L2 hits) by 80 blocks
//  3. Q warmed (normal | evict_last), M streamed (normal | evict_first), then Q read by 80 blocks
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

enum Pol { NORMAL = 0, EVICT_FIRST = 1, EVICT_LAST = 2 };

template <int POL>
__device__ __forceinline__ uint4 ld16(const uint4* p, uint64_t pol) {
  uint4 v;
  if (POL == NORMAL)
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
  return v;
}

template <int POL>
__global__ void __launch_bounds__(512) stream(const uint4* buf, size_t n16, unsigned* sink) {
  uint64_t pol = 0;
  if (POL == EVICT_FIRST) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  if (POL == EVICT_LAST) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  // block b owns a contiguous slice (like a worker's rows); 16 loads a thread in flight a round
  const size_t per = (n16 + gridDim.x - 1) / gridDim.x;
  const size_t b0 = blockIdx.x * per, b1 = min(n16, b0 + per);
  unsigned acc = 0;
  for (size_t base = b0 + threadIdx.x; base < b1; base += 16 * 512) {
    uint4 v[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) { size_t i = base + (size_t)k * 512; v[k] = i < b1 ? ld16<POL>(buf + i, pol) : make_uint4(0,0,0,0); }
#pragma unroll
    for (int k = 0; k < 16; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

template <int POL>
float timed(const uint4* buf, size_t bytes, int blocks, unsigned* sink) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a);
  stream<POL><<<blocks, 512>>>(buf, bytes / 16, sink);
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b); cudaEventDestroy(a); cudaEventDestroy(b);
  return ms * 1000.f;
}

float med(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main() {
  const size_t QB = 29491200, MB_ = 199065600, FB = 256ull << 20;  // 80 x 64 x 2880 x 2 ; 3 x 32 x 2880 x 2880 x ... ~199 MB; flush
  uint4 *q, *m, *f; unsigned* sink;
  CK(cudaMalloc(&q, QB)); CK(cudaMalloc(&m, MB_)); CK(cudaMalloc(&f, FB)); CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(q, 1, QB)); CK(cudaMemset(m, 2, MB_)); CK(cudaMemset(f, 3, FB));
  cudaDeviceProp pr; cudaGetDeviceProperties(&pr, 0);
  printf("device %s, %d SMs, L2 %d MB, persisting max %d MB\n", pr.name, pr.multiProcessorCount, pr.l2CacheSize >> 20, pr.persistingL2CacheMaxSize >> 20);
  const int R = 15;
  auto flush = [&]() { timed<NORMAL>(f, FB, 132, sink); };
  // 1. cold Q by blocks
  for (int blocks : {80, 128, 132}) {
    std::vector<float> t; for (int r = 0; r < R; ++r) { flush(); t.push_back(timed<NORMAL>(q, QB, blocks, sink)); }
    printf("cold Q 29.5 MB, %3d blocks: %7.1f us (%.2f TB/s, %.1f GB/s a block)\n", blocks, med(t), QB / med(t) / 1e6, QB / blocks / med(t) / 1e3);
  }
  for (int blocks : {80, 132}) {
    std::vector<float> t; for (int r = 0; r < R; ++r) { flush(); timed<NORMAL>(q, QB, 132, sink); t.push_back(timed<NORMAL>(q, QB, blocks, sink)); }
    printf("hot Q (read just before), %3d blocks: %7.1f us (%.2f TB/s)\n", blocks, med(t), QB / med(t) / 1e6);
  }
  {
    std::vector<float> tn, tf;
    for (int r = 0; r < R; ++r) { tn.push_back(timed<NORMAL>(m, MB_, 132, sink)); tf.push_back(timed<EVICT_FIRST>(m, MB_, 132, sink)); }
    printf("M 199 MB stream, 132 blocks: normal %7.1f us (%.2f TB/s), evict_first %7.1f us (%.2f TB/s)\n", med(tn), MB_ / med(tn) / 1e6, med(tf), MB_ / med(tf) / 1e6);
  }
  const char* wn[] = {"normal", "evict_first", "evict_last"};
  for (int warm : {NORMAL, EVICT_LAST})
    for (int mp : {NORMAL, EVICT_FIRST}) {
      std::vector<float> t;
      for (int r = 0; r < R; ++r) {
        flush();
        if (warm == NORMAL) timed<NORMAL>(q, QB, 132, sink); else timed<EVICT_LAST>(q, QB, 132, sink);
        if (mp == NORMAL) timed<NORMAL>(m, MB_, 132, sink); else timed<EVICT_FIRST>(m, MB_, 132, sink);
        t.push_back(timed<NORMAL>(q, QB, 80, sink));
      }
      printf("Q warmed %-10s, then M streamed %-11s, then Q by 80 blocks: %7.1f us (%.2f TB/s)\n", wn[warm], wn[mp], med(t), QB / med(t) / 1e6);
    }
  // the same with Q read evict_first (demoted on use) on a second pass: does the kept set still hold?
  {
    std::vector<float> t;
    for (int r = 0; r < R; ++r) {
      flush();
      timed<EVICT_LAST>(q, QB, 132, sink); timed<EVICT_FIRST>(m, MB_, 132, sink);
      timed<EVICT_FIRST>(q, QB, 80, sink);                      // consumed, demoted
      timed<EVICT_FIRST>(m, MB_, 132, sink);
      t.push_back(timed<NORMAL>(q, QB, 80, sink));
    }
    printf("after demotion (Q read evict_first) and another M evict_first stream, Q by 80: %7.1f us\n", med(t));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
