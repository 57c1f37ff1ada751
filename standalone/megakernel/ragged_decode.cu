// Ragged decode attention as one persistent kernel (the ragged-decode contract).
//
// What it computes: for each request b, out[b] = softmax(q[b] K_b^T / sqrt(hd)) V_b with
// K_b = k[starts[b] : starts[b]+lens[b]] (GQA: `group` query heads share one KV head),
// starts/lens living only on the device and re-permuted every call. hd = 128, bf16 inputs,
// fp32 online softmax, fp32 partials, fp32 output (B, n_q*hd) head-major.
//
// Why this is the fixed (correct) variant of a megakernel, and where its hazards are:
//  * The schedule is computed on the device every call: each block ranks the requests
//    longest-first, prefix-sums their lengths into one "line" of tokens, and its producer
//    warp takes chunks of that line from an atomic counter. The default (`split`)
//    schedule cuts each request into fixed tiles (2048 tokens), so the splits per request
//    follow from `lens`; `guided` instead cuts the whole line into geometrically shrinking
//    chunks (phase j has `phase_chunks` chunks of weight 2^(J-1-j)); tile 0 is the naive
//    one-block-per-request schedule. All three are one runtime switch, not copies.
//  * A chunk may cover parts of several requests ("pieces"). A piece that is a whole
//    request writes the output directly; otherwise it writes (m, l, acc) partials into
//    slot (chunk + line position), unique for non-empty pieces because chunk and request
//    boundaries are two monotone partitions of the same line.
//  * Cross-block hand-off (the hazard a persistent kernel must get right): writers store
//    partials, __threadfence(), barrier, then one thread adds the piece's token count to
//    the request's arrival counter; the block whose add completes the request fences and
//    reads every partial with ld.global.cg (L2, never a stale L1 line) for the
//    flash-decoding merge. The last arriver resets the arrival counter and the last block
//    out resets the work counter: no extra launch, nothing to clear between calls.
//  * Inside a block: warp 8 is the producer. It copies each 16-token stage of K and V (all
//    KV heads of 16 consecutive arena rows) into a 3-stage shared-memory ring with one
//    cp.async.bulk per tensor (evict-first in L2), completing on a `full` mbarrier; warps
//    0..7 (one KV head each, the `group` query heads sharing every K/V read) wait on
//    `full`, compute, and release the stage on an `empty` mbarrier (count 8). Unpadded rows
//    are 2 KB apart, so odd lane groups read their 64-byte chunks in swapped order to keep
//    the 16-byte shared loads conflict-free. (`contiguous = 0` instead copies row by row
//    into padded rows: one bulk copy per row measured 3x slower per SM.)
//    QK^T and PV run on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate); V is
//    transposed in registers with movmatrix.
//  * Per-task profiler (hz_profiler.h, only in -DHZ_PROFILER builds): each task kind of the
//    Task enum (layout.cuh) records begin/end per instance per block, thread 0 recording.
//    An attend span runs from the moment the consumers are free (previous piece or merge
//    done) to the piece's output or partial being published, so spans of one block never
//    overlap and sumCTA is the block-time the kind really took.
#include <math.h>
#include <stdint.h>

#include "layout.cuh"
#include "ptx.cuh"
#include "schedule.cuh"

namespace {

// ---- producer warp: chunks -> pieces -> 16-token stages ----------------------------------

__device__ void produce(const Params& p, const Smem& s, int n_chunks) {
  const int lane = threadIdx.x & 31;
  const uint32_t row_bytes = (uint32_t)p.n_kv * HD * 2;
  const uint64_t policy = evict_first_policy();
  int stage = 0;
  uint32_t phase = 0;
  int next = 0;
  if (lane == 0) next = atomicAdd(&p.ctr[CTR_WORK], 1);
  int k = __shfl_sync(0xffffffffu, next, 0);
  while (k < n_chunks) {
    if (lane == 0) next = atomicAdd(&p.ctr[CTR_WORK], 1);  // prefetch, consumed after this chunk
    long long a, e;
    chunk_range(p, s, k, a, e);
    while (a < e) {
      const int ls = upper_bound(s.pref, p.B + 1, a) - 1;  // skips empty requests
      const long long base = s.pref[ls], pe = min(e, s.pref[ls + 1]);
      const int req = s.order[ls];
      const bool whole = (a == base) && (pe == s.pref[ls + 1]);
      const long long row_first = (long long)s.start[req] + (a - base);
      {  // the consumers read this request's queries when the piece starts: warm L2 now
        const char* qrow = reinterpret_cast<const char*>(p.q + (size_t)req * p.n_q * HD);
        for (int off = lane * 128; off < p.n_q * HD * 2; off += 32 * 128) prefetch_l2(qrow + off);
      }
      for (long long t0 = a; t0 < pe; t0 += STEP) {
        const int n = (int)min((long long)STEP, pe - t0);
        hz_mbar_wait(&s.empty[stage], phase ^ 1);
        if (lane == 0) {
          StageDesc d;
          d.req = req;
          d.slot = k + ls;
          d.n = n;
          d.flags = (t0 == a ? ST_FIRST : 0) | (t0 + STEP >= pe ? ST_LAST : 0) | (whole ? ST_WHOLE : 0);
          d.piece_len = (int)(pe - a);
          d.pad0 = d.pad1 = d.pad2 = 0;
          s.desc[stage] = d;
          if (p.probe == PROBE_COMPUTE_ONLY) hz_mbar_arrive(&s.full[stage]);
          else hz_mbar_arrive_expect_tx(&s.full[stage], 2u * n * row_bytes);
        }
        __syncwarp();
        const long long row = row_first + (t0 - a) + (lane & 15);
        if (p.probe == PROBE_COMPUTE_ONLY) {
        } else if (p.contiguous) {  // the stage's rows are contiguous in the arena: one copy each
          if (lane < 2) {
            const size_t off = (size_t)(row_first + (t0 - a)) * p.n_kv * HD;
            char* dst = (lane == 0 ? s.kst : s.vst) + (size_t)stage * STEP * row_bytes;
            hz_bulk_g2s_hint(dst, (lane == 0 ? p.k : p.v) + off, n * row_bytes, &s.full[stage], policy);
          }
        } else if ((lane & 15) < n) {  // one copy per row into a padded (conflict-free) row
          const size_t off = (size_t)row * p.n_kv * HD;
          char* dst = (lane < 16 ? s.kst : s.vst) + ((size_t)stage * STEP + (lane & 15)) * s.row_stride;
          hz_bulk_g2s_hint(dst, (lane < 16 ? p.k : p.v) + off, row_bytes, &s.full[stage], policy);
        }
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
      }
      a = pe;
    }
    k = __shfl_sync(0xffffffffu, next, 0);
  }
  hz_mbar_wait(&s.empty[stage], phase ^ 1);
  if (lane == 0) {
    s.desc[stage].flags = ST_STOP;
    hz_mbar_arrive(&s.full[stage]);
  }
}

// ---- consumer warps ----------------------------------------------------------------------

struct WarpState {
  float m, l;        // running max (log2 domain) and this lane's partial sum, head g
  float acc[8][4];   // O^T fragment: rows = dims (acc_dim), cols = heads 2t, 2t+1
};

// CONTIG: rows are unpadded (stride = row bytes, a multiple of 128), so tokens g and g+1
// of one quarter-warp would hit the same banks; odd lane groups read the 64-byte chunks in
// swapped order (j ^ 1) and the registers are swapped back with selects.
template <bool TAIL, bool CONTIG>
__device__ __forceinline__ void attend_stage(const Params& p, const Smem& s, WarpState& st, const uint4 (&qf)[4],
                                             int stage, int h, int n) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int stride = CONTIG ? p.n_kv * HD * 2 : s.row_stride;
  const int sw = CONTIG ? (g & 1) : 0;
  const char* kbase = s.kst + (size_t)stage * STEP * stride + h * HD * 2 + 16 * t;
  const char* vbase = s.vst + (size_t)stage * STEP * stride + h * HD * 2 + 16 * t;
  uint4 kr[2][4], vr[2][4];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int tk = 8 * hh + g;
    const bool valid = !TAIL || tk < n;  // rows >= n hold stale bytes: never let them in
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      kr[hh][j] = *reinterpret_cast<const uint4*>(kbase + tk * stride + 64 * (j ^ sw));
      vr[hh][j] = *reinterpret_cast<const uint4*>(vbase + tk * stride + 64 * (j ^ sw));
      if (TAIL && !valid) { kr[hh][j] = make_uint4(0, 0, 0, 0); vr[hh][j] = make_uint4(0, 0, 0, 0); }
    }
    if (CONTIG) {
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        const uint4 k0 = kr[hh][j], k1 = kr[hh][j + 1], v0 = vr[hh][j], v1 = vr[hh][j + 1];
        kr[hh][j] = sw ? k1 : k0; kr[hh][j + 1] = sw ? k0 : k1;
        vr[hh][j] = sw ? v1 : v0; vr[hh][j + 1] = sw ? v0 : v1;
      }
    }
  }
  // S = Q K^T: rows = query heads (g < group), cols = tokens 8hh + 2t + {0,1}.
  float sc[2][4];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    sc[hh][0] = sc[hh][1] = sc[hh][2] = sc[hh][3] = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      mma_bf16(sc[hh], qf[j].x, 0u, qf[j].y, 0u, kr[hh][j].x, kr[hh][j].y);
      mma_bf16(sc[hh], qf[j].z, 0u, qf[j].w, 0u, kr[hh][j].z, kr[hh][j].w);
    }
  }
  float x[2][2];
  float mx = -INFINITY;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool ok = !TAIL || (8 * hh + 2 * t + e) < n;
      x[hh][e] = ok ? sc[hh][e] * p.scale_log2 : -INFINITY;
      mx = fmaxf(mx, x[hh][e]);
    }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(st.m, mx);  // finite: token 0 of a stage is always valid
  const float alpha = exp2f(st.m - m_new);
  float pr[2][2];
  float lsum = 0.f;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int e = 0; e < 2; ++e) { pr[hh][e] = exp2f(x[hh][e] - m_new); lsum += pr[hh][e]; }
  st.l = st.l * alpha + lsum;
  st.m = m_new;
  // The accumulator's columns are heads 2t and 2t+1: fetch their rescale factors.
  const float a0 = __shfl_sync(0xffffffffu, alpha, (2 * t) * 4);
  const float a1 = __shfl_sync(0xffffffffu, alpha, (2 * t + 1) * 4);
  const uint32_t b0 = pack_bf16(pr[0][0], pr[0][1]);  // P^T rows = tokens 2t, 2t+1
  const uint32_t b1 = pack_bf16(pr[1][0], pr[1][1]);  // tokens 8 + 2t, 8 + 2t + 1
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int qp = 0; qp < 2; ++qp) {
      float (&c)[4] = st.acc[2 * j + qp];
      c[0] *= a0; c[1] *= a1; c[2] *= a0; c[3] *= a1;
      const uint32_t v0 = transpose8x8(word(vr[0][j], 2 * qp));
      const uint32_t v1 = transpose8x8(word(vr[0][j], 2 * qp + 1));
      const uint32_t v2 = transpose8x8(word(vr[1][j], 2 * qp));
      const uint32_t v3 = transpose8x8(word(vr[1][j], 2 * qp + 1));
      mma_bf16(c, v0, v1, v2, v3, b0, b1);  // O^T += V^T P^T
    }
}

// ---- flash-decoding merge of one request's partials, by the block that completed it ------
//
// Online over batches of COMBINE_BATCH pieces: (m, l) of a batch are loaded in parallel,
// each head's running max/sum is updated and the running accumulators rescaled, then the
// partial accumulators are read eight pieces at a time per unit (loads issued together:
// the merge is L2-latency bound otherwise).

// Query heads of float4 unit u of a partial slot: its x, z belong to h0 and y, w to h1
// (h1 is clamped in range; a head past the group is never written out).
__device__ __forceinline__ void unit_heads(const Params& p, int u, int& h0, int& h1) {
  const int tqi = (u >> 3) % p.tq, h = (u >> 3) / p.tq / 8;
  h0 = h * p.group + 2 * tqi;
  h1 = min(h0 + 1, p.n_q - 1);
}

__device__ void merge_request(const Params& p, const Smem& s, int req) {
  const int tid = threadIdx.x, ls = s.pos[req];
  const long long a = s.pref[ls], e = s.pref[ls + 1];
  const int k_lo = chunk_of(p, s, a), k_hi = chunk_of(p, s, e - 1);
  const int units = p.n_kv * 8 * p.tq * 8;  // float4 units of one slot
  for (int head = tid; head < p.n_q; head += CONSUMERS) { s.m_head[head] = -INFINITY; s.l_head[head] = 0.f; }
  float4 acc[MAX_UNITS_PER_THREAD];
#pragma unroll
  for (int r = 0; r < MAX_UNITS_PER_THREAD; ++r) acc[r] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int kb = k_lo; kb <= k_hi; kb += COMBINE_BATCH) {
    const int cnt = min(COMBINE_BATCH, k_hi - kb + 1);
    if (tid < COMBINE_BATCH) {
      int sl = -1;
      if (tid < cnt) {
        long long ca, ce;
        chunk_range(p, s, kb + tid, ca, ce);
        if (ca < ce) sl = kb + tid + ls;  // empty guided chunk: no piece
      }
      s.slot[tid] = sl;
    }
    consumer_sync();
    for (int idx = tid; idx < cnt * p.n_q; idx += CONSUMERS) {
      const int sl = s.slot[idx / p.n_q];
      s.ml[idx] = sl < 0 ? make_float2(-INFINITY, 0.f) : __ldcg(p.pml + (size_t)sl * p.n_q + idx % p.n_q);
    }
    consumer_sync();
    for (int head = tid; head < p.n_q; head += CONSUMERS) {
      const float m_old = s.m_head[head];
      float m_new = m_old;
      for (int i = 0; i < cnt; ++i) m_new = fmaxf(m_new, s.ml[i * p.n_q + head].x);
      const float al = m_new == -INFINITY ? 1.f : exp2f(m_old - m_new);
      float l = s.l_head[head] * al;
      for (int i = 0; i < cnt; ++i) {
        const float2 ml = s.ml[i * p.n_q + head];
        const float w = ml.x == -INFINITY ? 0.f : exp2f(ml.x - m_new);
        s.w[i * p.n_q + head] = w;
        l += ml.y * w;
      }
      s.m_head[head] = m_new;
      s.l_head[head] = l;
      s.alpha[head] = al;
    }
    consumer_sync();
    for (int i0 = 0; i0 < cnt; i0 += 8) {
#pragma unroll
      for (int r = 0; r < MAX_UNITS_PER_THREAD; ++r) {
        const int u = r * CONSUMERS + tid;
        if (u >= units) continue;
        int h0, h1;
        unit_heads(p, u, h0, h1);
        if (i0 == 0) {  // the running accumulator moves to this batch's max
          const float a0 = s.alpha[h0], a1 = s.alpha[h1];
          acc[r].x *= a0; acc[r].y *= a1; acc[r].z *= a0; acc[r].w *= a1;
        }
        float4 v[8];
#pragma unroll
        for (int ii = 0; ii < 8; ++ii) {
          const int sl = i0 + ii < cnt ? s.slot[i0 + ii] : -1;
          v[ii] = sl < 0 ? make_float4(0.f, 0.f, 0.f, 0.f) : __ldcg(p.pacc + (size_t)sl * units + u);
        }
#pragma unroll
        for (int ii = 0; ii < 8; ++ii) {
          if (i0 + ii >= cnt) break;
          const float w0 = s.w[(i0 + ii) * p.n_q + h0], w1 = s.w[(i0 + ii) * p.n_q + h1];
          acc[r].x += v[ii].x * w0; acc[r].y += v[ii].y * w1; acc[r].z += v[ii].z * w0; acc[r].w += v[ii].w * w1;
        }
      }
    }
    consumer_sync();  // the next batch rewrites slot/ml/w/alpha
  }
#pragma unroll
  for (int r = 0; r < MAX_UNITS_PER_THREAD; ++r) {
    const int u = r * CONSUMERS + tid;
    if (u >= units) continue;
    const int mt = u & 7, tqi = (u >> 3) % p.tq, g = ((u >> 3) / p.tq) % 8, h = (u >> 3) / p.tq / 8;
    float* o = p.out + ((size_t)req * p.n_q + (size_t)h * p.group) * HD;
    const float vals[4] = {acc[r].x, acc[r].y, acc[r].z, acc[r].w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int head = 2 * tqi + (c & 1);
      if (head < p.group) o[head * HD + acc_dim(mt, c, g)] = vals[c] / s.l_head[h * p.group + head];
    }
  }
}

// End of a piece for KV head h (h < 0: this warp has no head): write the output (whole
// request) or the partial, then, for partials, the arrival protocol and maybe the merge.
__device__ void finish_piece(const Params& p, const Smem& s, WarpState& st, const StageDesc& d, int h,
                             uint64_t span) {
  const uint64_t piece = ((uint64_t)(uint32_t)d.req << 32) | (uint32_t)d.piece_len;  // aux: req | tokens
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if (h >= 0) {
    st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
    st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
    if (d.flags & ST_WHOLE) {
      const float inv = 1.f / st.l;
      const float inv0 = __shfl_sync(0xffffffffu, inv, (2 * t) * 4);
      const float inv1 = __shfl_sync(0xffffffffu, inv, (2 * t + 1) * 4);
      float* o = p.out + ((size_t)d.req * p.n_q + (size_t)h * p.group) * HD;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int head = 2 * t + (c & 1);
          if (head < p.group) o[head * HD + acc_dim(mt, c, g)] = st.acc[mt][c] * ((c & 1) ? inv1 : inv0);
        }
    } else {
      if (t < p.tq) {
        float4* dst = p.pacc + ((((size_t)d.slot * p.n_kv + h) * 8 + g) * p.tq + t) * 8;
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) dst[mt] = make_float4(st.acc[mt][0], st.acc[mt][1], st.acc[mt][2], st.acc[mt][3]);
      }
      if (t == 0 && g < p.group) p.pml[(size_t)d.slot * p.n_q + h * p.group + g] = make_float2(st.m, st.l);
    }
  }
  if (d.flags & ST_WHOLE) {
    if (threadIdx.x == 0) HZ_PROF_END(p.prof, TASK_ATTEND, span, piece);
    return;
  }
  __threadfence();  // release this thread's partial stores before the arrival
  consumer_sync();
  if (threadIdx.x == 0) {
    const int before = atomicAdd(&p.ctr[CTR_ARRIVE + d.req], d.piece_len);
    const bool last = before + d.piece_len == s.len[d.req];
    if (last) {
      p.ctr[CTR_ARRIVE + d.req] = 0;  // nobody else touches it again this launch
      __threadfence();                // acquire side: the partials read below come after
    }
    s.misc[0] = last;
  }
  consumer_sync();
  const bool last = s.misc[0];
  consumer_sync();  // everyone has read the flag before the next piece may rewrite it
  if (threadIdx.x == 0) HZ_PROF_END(p.prof, TASK_ATTEND, span, piece);
  if (last) {
    HZ_PROF_BEGIN(merge_span);
    merge_request(p, s, d.req);
    if (threadIdx.x == 0) HZ_PROF_END(p.prof, TASK_MERGE, merge_span, d.req);
  }
}

__device__ void consume(const Params& p, const Smem& s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int h = warp < p.n_kv ? warp : -1;
  WarpState st;
  uint4 qf[4];
  int stage = 0;
  uint32_t phase = 0;
  HZ_PROF_BEGIN(span);  // the consumers are free from here: the next piece's span starts
  while (true) {
    hz_mbar_wait(&s.full[stage], phase);
    const StageDesc d = s.desc[stage];
    if (d.flags & ST_STOP) break;
    if (p.stall_cycles > 0) {  // candidate knob: a deliberately slower consumer (0 in production)
      const long long t0 = clock64();
      while (clock64() - t0 < p.stall_cycles) {
      }
    }
    if (p.probe == PROBE_STREAM_ONLY) {
      __syncwarp();
      if (lane == 0) hz_mbar_arrive(&s.empty[stage]);
      if (++stage == STAGES) { stage = 0; phase ^= 1; }
      continue;
    }
    if (h >= 0) {
      if (d.flags & ST_FIRST) {
        const bool qrow = g < p.group;
        const __nv_bfloat16* qp = p.q + ((size_t)d.req * p.n_q + (size_t)h * p.group + (qrow ? g : 0)) * HD + 8 * t;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          qf[j] = *reinterpret_cast<const uint4*>(qp + 32 * j);
          if (!qrow) qf[j] = make_uint4(0, 0, 0, 0);
        }
        st.m = -INFINITY;
        st.l = 0.f;
#pragma unroll
        for (int a = 0; a < 8; ++a) st.acc[a][0] = st.acc[a][1] = st.acc[a][2] = st.acc[a][3] = 0.f;
      }
      if (p.contiguous) {
        if (d.n == STEP) attend_stage<false, true>(p, s, st, qf, stage, h, d.n);
        else attend_stage<true, true>(p, s, st, qf, stage, h, d.n);
      } else {
        if (d.n == STEP) attend_stage<false, false>(p, s, st, qf, stage, h, d.n);
        else attend_stage<true, false>(p, s, st, qf, stage, h, d.n);
      }
    }
    __syncwarp();
    if (lane == 0) hz_mbar_arrive(&s.empty[stage]);  // this warp is done reading the stage
    if (d.flags & ST_LAST) {
      finish_piece(p, s, st, d, h, span);
      HZ_PROF_RESTAMP(span);
    }
    if (++stage == STAGES) { stage = 0; phase ^= 1; }
  }
}

__device__ void fill_request(const Params& p, int req, float value) {
  float* o = p.out + (size_t)req * p.n_q * HD;
  for (int i = threadIdx.x; i < p.n_q * HD; i += THREADS) o[i] = value;
}

// ---- the kernel --------------------------------------------------------------------------

__global__ void __launch_bounds__(THREADS, 1) ragged_decode_kernel(const Params p) {
  HZ_PROF_BEGIN(worker_span);
  extern __shared__ __align__(128) char smem_raw[];
  const Smem s = carve(smem_raw, p.B, p.n_q, p.n_kv);
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int i = 0; i < STAGES; ++i) { hz_mbar_init(&s.full[i], 1); hz_mbar_init(&s.empty[i], CONSUMER_WARPS); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  prologue(p, s);  // ends with __syncthreads: barriers initialised, line built
  if (tid == 0) HZ_PROF_END(p.prof, TASK_PROLOGUE, worker_span, 0);
  const int n_chunks = p.schedule == SCHED_GUIDED ? p.phases * p.phase_chunks : s.tpref[p.B];
  const bool slots_ok = p.schedule != SCHED_SPLIT || p.tile == 0 || n_chunks + p.B <= p.n_slots;

  if (blockIdx.x == 0) {  // requests with no piece: empty (0) or invalid (NaN); or no room
    HZ_PROF_BEGIN(fill_span);
    for (int b = 0; b < p.B; ++b)
      if (!slots_ok || s.len[b] <= 0) fill_request(p, b, (s.len[b] == 0 && slots_ok) ? 0.f : NAN);
    if (tid == 0) {
      int bits = slots_ok ? 0 : ERR_SLOTS;
      for (int b = 0; b < p.B; ++b) bits |= s.len[b] < 0 ? ERR_BAD_REQUEST : 0;
      if (bits) atomicOr(&p.ctr[CTR_ERROR], bits);
      HZ_PROF_END(p.prof, TASK_FILL, fill_span, 0);
    }
  }
  if (tid >= CONSUMERS) produce(p, s, slots_ok ? n_chunks : 0);
  else consume(p, s);

  __syncthreads();
  if (tid == 0) {
    __threadfence();
    if (atomicAdd(&p.ctr[CTR_DONE], 1) == (int)gridDim.x - 1) {  // last block out resets
      atomicExch(&p.ctr[CTR_WORK], 0);
      atomicExch(&p.ctr[CTR_DONE], 0);
    }
    HZ_PROF_END(p.prof, TASK_WORKER, worker_span, 0);
  }
}

}  // namespace

// ---- host API (ctypes) -------------------------------------------------------------------

static hz_prof_t g_prof = {nullptr, nullptr, 0, 0};  // set by hz_rd_set_profiler
static int g_stall_cycles = 0;                        // set by hz_rd_set_stall

extern "C" {

int hz_rd_head_dim() { return HD; }
// 1 when this library was built with -DHZ_PROFILER (its launches can record spans).
int hz_rd_profiler_compiled() { return HZ_PROF_ENABLED; }
const char* hz_rd_task_names() { return HZ_RD_TASK_NAMES; }
// The ring the following launches record into (records NULL: none). The caller zeroes
// *claimed before each launch it wants to decode on its own.
void hz_rd_set_profiler(void* records, void* claimed, unsigned capacity) {
  g_prof.records = static_cast<uint64_t*>(records);
  g_prof.claimed = static_cast<unsigned long long*>(claimed);
  g_prof.capacity = records ? capacity : 0u;
}
// Candidate knob for the perf gate: consumers idle this many cycles per stage (0: off).
void hz_rd_set_stall(int cycles) { g_stall_cycles = cycles > 0 ? cycles : 0; }
int hz_rd_max_kv_heads() { return CONSUMER_WARPS; }
int hz_rd_threads() { return THREADS; }
int hz_rd_counter_words(int B) { return CTR_ARRIVE + B; }
size_t hz_rd_smem_bytes(int B, int n_q, int n_kv) { return smem_bytes(B, n_q, n_kv); }

// Raise the kernel's dynamic shared-memory limit, then report blocks per SM (0: does not
// fit) and the SM count.
int hz_rd_occupancy(int B, int n_q, int n_kv, int* blocks_per_sm, int* num_sms) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return (int)err;
  err = cudaDeviceGetAttribute(num_sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return (int)err;
  // Allow the device maximum once, so handles of any configuration can launch in any order.
  int optin = 0;
  err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return (int)err;
  const size_t smem = smem_bytes(B, n_q, n_kv);
  if (smem > (size_t)optin) { *blocks_per_sm = 0; return 0; }
  err = cudaFuncSetAttribute(ragged_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  if (err != cudaSuccess) return (int)err;
  return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, ragged_decode_kernel, THREADS, smem);
}

const char* hz_rd_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

// One launch on `stream`. Returns the launch's cudaError_t (0 = launched).
int hz_rd_launch(const void* q, const void* k, const void* v, const int* starts, const int* lens, float* out,
                 void* pacc, void* pml, int* counters, long long rows, int B, int n_q, int n_kv, int schedule,
                 int tile, int phases, int phase_chunks, int n_slots, int grid, int probe, int contiguous,
                 void* stream) {
  Params p;
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.k = static_cast<const __nv_bfloat16*>(k);
  p.v = static_cast<const __nv_bfloat16*>(v);
  p.starts = starts;
  p.lens = lens;
  p.out = out;
  p.pacc = static_cast<float4*>(pacc);
  p.pml = static_cast<float2*>(pml);
  p.ctr = counters;
  p.rows = rows;
  p.B = B;
  p.n_q = n_q;
  p.n_kv = n_kv;
  p.group = n_q / n_kv;
  p.tq = (p.group + 1) / 2;
  p.schedule = schedule;
  p.tile = tile;
  p.phases = phases;
  p.phase_chunks = phase_chunks;
  p.n_slots = n_slots;
  p.probe = probe;
  p.contiguous = contiguous;
  p.stall_cycles = g_stall_cycles;
  p.prof = g_prof;
  p.scale_log2 = 1.4426950408889634f / sqrtf((float)HD);
  const size_t smem = smem_bytes(B, n_q, n_kv);
  ragged_decode_kernel<<<grid, THREADS, smem, static_cast<cudaStream_t>(stream)>>>(p);
  return (int)cudaGetLastError();
}

}  // extern "C"

extern "C" {
// Kernel nodes and all nodes of a captured graph (to count launches per call).
int hz_rd_graph_node_counts(void* graph, int* kernels, int* total) {
  size_t n = 0;
  cudaGraph_t g = static_cast<cudaGraph_t>(graph);
  cudaError_t err = cudaGraphGetNodes(g, nullptr, &n);
  if (err != cudaSuccess) return (int)err;
  cudaGraphNode_t nodes[64];
  if (n > 64) { *total = (int)n; *kernels = -1; return 0; }
  err = cudaGraphGetNodes(g, nodes, &n);
  if (err != cudaSuccess) return (int)err;
  int kc = 0;
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType t;
    if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeKernel) ++kc;
  }
  *kernels = kc;
  *total = (int)n;
  return 0;
}
}  // extern "C"
