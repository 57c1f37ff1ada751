// Ragged-decode megakernel: the device-side schedule (longest-first line, guided and split
// chunks, chunk lookup) and the per-call prologue that builds it in shared memory.
// hazards/ragged_decode/schedule.py states the same formulas for the CPU tests.
#pragma once
#include <stdint.h>

#include "layout.cuh"

namespace {

// ---- the schedule ------------------------------------------------------------------------

// Guided chunks: phase j (0..J-1) has `pc` chunks of weight 2^(J-1-j); chunk k starts at
// W * G(k) / G_total in line coordinates.
__device__ __forceinline__ long long guided_start(int k, long long W, int J, int pc) {
  if (k >= J * pc) return W;
  const int j = k / pc, r = k - j * pc;
  const long long G = (long long)pc * ((1LL << J) - (1LL << (J - j))) + (long long)r * (1LL << (J - 1 - j));
  const long long Gt = (long long)pc * ((1LL << J) - 1);
  return (W * G) / Gt;
}

template <typename T>
__device__ __forceinline__ int upper_bound(const T* a, int n, T x) {  // first i with a[i] > x
  int lo = 0, hi = n;
  while (lo < hi) { const int mid = (lo + hi) >> 1; if (a[mid] <= x) lo = mid + 1; else hi = mid; }
  return lo;
}

// Line range [a, e) of chunk k.
__device__ __forceinline__ void chunk_range(const Params& p, const Smem& s, int k, long long& a, long long& e) {
  const long long W = s.pref[p.B];
  if (p.schedule == SCHED_GUIDED) {
    a = guided_start(k, W, p.phases, p.phase_chunks);
    e = guided_start(k + 1, W, p.phases, p.phase_chunks);
  } else {
    const int ls = upper_bound(s.tpref, p.B + 1, k) - 1;  // line position owning tile k
    const long long base = s.pref[ls], end = s.pref[ls + 1];
    if (p.tile > 0) {
      a = base + (long long)(k - s.tpref[ls]) * p.tile;
      e = min(a + p.tile, end);
    } else {
      a = base; e = end;
    }
  }
}

// Chunk containing line position x (x < W).
__device__ __forceinline__ int chunk_of(const Params& p, const Smem& s, long long x) {
  if (p.schedule == SCHED_SPLIT) {
    const int ls = upper_bound(s.pref, p.B + 1, x) - 1;
    return s.tpref[ls] + (p.tile > 0 ? (int)((x - s.pref[ls]) / p.tile) : 0);
  }
  const long long W = s.pref[p.B];
  int lo = 0, hi = p.phases * p.phase_chunks - 1;  // last k with start(k) <= x
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (guided_start(mid, W, p.phases, p.phase_chunks) <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// ---- per-call prologue: rank longest-first, prefix sums ----------------------------------

__device__ void prologue(const Params& p, const Smem& s) {
  const int tid = threadIdx.x;
  for (int b = tid; b < p.B; b += THREADS) {
    const int st = p.starts[b], ln = p.lens[b];
    const bool ok = ln >= 0 && st >= 0 && (long long)st + ln <= p.rows;
    s.start[b] = st;
    s.len[b] = ok ? ln : -1;
  }
  __syncthreads();
  // Longest first; ties by request index. O(B^2) compares over the block: B is small.
  for (int b = tid; b < p.B; b += THREADS) {
    const int lb = max(s.len[b], 0);
    int rank = 0;
    for (int o = 0; o < p.B; ++o) {
      const int lo = max(s.len[o], 0);
      rank += (lo > lb) || (lo == lb && o < b);
    }
    s.order[rank] = b;
    s.pos[b] = rank;
  }
  __syncthreads();
  if (tid < 32) {  // warp 0: exclusive scans over the line (lengths, and tiles for split)
    const int per = (p.B + 31) / 32, lo = min(tid * per, p.B), hi = min(lo + per, p.B);
    long long tot = 0;
    int ttot = 0;
    for (int i = lo; i < hi; ++i) {
      const int ln = max(s.len[s.order[i]], 0);
      tot += ln;
      ttot += p.tile > 0 ? (ln + p.tile - 1) / p.tile : (ln > 0);
    }
    long long inc = tot;
    int tinc = ttot;
    for (int d = 1; d < 32; d <<= 1) {
      const long long u = __shfl_up_sync(0xffffffffu, inc, d);
      const int tu = __shfl_up_sync(0xffffffffu, tinc, d);
      if (tid >= d) { inc += u; tinc += tu; }
    }
    long long run = inc - tot;
    int trun = tinc - ttot;
    for (int i = lo; i < hi; ++i) {
      const int ln = max(s.len[s.order[i]], 0);
      s.pref[i] = run;
      s.tpref[i] = trun;
      run += ln;
      trun += p.tile > 0 ? (ln + p.tile - 1) / p.tile : (ln > 0);
    }
    if (tid == 31) { s.pref[p.B] = inc; s.tpref[p.B] = tinc; }
  }
  __syncthreads();
}

}  // namespace
