// mkl_attn_mma.h -- campaign step 15 (MKL_ATTN_MMA, candidate step_m): which (head, token, dim)
// each register element of a lane holds in attend_chunk<GQ, NKV>'s tensor-core block loop (GQ = 8
// and GQ = 4: both compiled head groupings), as
// plain host/device functions. The kernel builds its mma.sync.m16n8k16 (.bf16, fp32 accumulate)
// fragments with them, and tests/megakernel_layers/test_attention_mma.py compiles them on the CPU
// with an emulator of the PTX ISA's fragment layout (written there from the ISA's figures, not
// from this file) to check the whole block (scores, online softmax, P.V) against plain loops.
//
// The mma's fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type";
// gid = lane >> 2, tig = lane & 3; a .b32 register's low half holds the lower index):
//   A (16 x 16, row): reg 0 (row gid, cols 2 tig, +1), reg 1 (row gid + 8, same cols),
//                     reg 2 (row gid, cols 2 tig + 8, +9), reg 3 (row gid + 8, cols 2 tig + 8, +9)
//   B (16 x 8, col):  reg 0 (k rows 2 tig, +1; col gid), reg 1 (k rows 2 tig + 8, +9; col gid)
//   C, D (fp32):      c0, c1 (row gid, cols 2 tig, +1), c2, c3 (row gid + 8, same cols)
// (A read from the ISA's row/col formulas; A, B and C also agree with the SM80_16x8x16 layouts of
// NVIDIA/cutlass 468e0ea, include/cute/atom/mma_traits_sm80.hpp.)
// The kernel's choices on top of them (a warp = one kv head's GQ q heads, a block = 32 tokens):
//   scores S = [q_hi; q_lo] K^T: A row h < 8 is bf16(q) of head h, row h + 8 is bf16(q - bf16(q))
//     of the same head, so D rows gid and gid + 8 sum to head gid's score. The sum over dims is
//     permuted (A and B alike): lane (gid, tig) owns dims [16 tig, 16 tig + 16) of its token, loaded
//     as two 16-B words; k-step j's k row 2 tig + e is dim 16 tig + 4 j + e, row 2 tig + 8 + e is
//     dim 16 tig + 4 j + 2 + e. N-tile nt's column n is the block's token 8 nt + n.
//   GQ = 4 (the small shape): rows h < 4 and h + 8 as above; rows 4-7 and 12-15 (the lanes with
//     gid >= 4: attn_mma_real_head false) are dummies: zero A (built from head gid - 4's q, then
//     zeroed: head kvh * 4 + gid would be another kv head's q, or past the q array), their D never
//     written. D row r depends only on A row r (and C row r), so they cannot disturb the real rows;
//     every lane still loads its K and V words (B's columns are tokens and dims, not heads).
//   P.V: the score D of n-tiles 2 s and 2 s + 1 (tokens 16 s + 2 tig + e, 16 s + 8 + 2 tig + e) is
//     the A of P.V's k-step s as it stands ([P_hi; P_lo] rows of head gid): no shuffle. B = V: the
//     n-tile nt's column n is dim 8 n + nt, so a lane's 8 dims [8 gid, 8 gid + 8) of a token are one
//     16-B word; a B register pairs two tokens' halves (a byte permute).
#pragma once
#include <stdint.h>
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

#include "mkl_model.h"

namespace mkl {

// whether the lane's A rows (gid, gid + 8) are a real head's: every lane at GQ = 8, gid < 4 at GQ = 4
template <int GQ>
MKL_HD bool attn_mma_real_head(int lane) { return GQ == 8 || (lane >> 2) < GQ; }
// the head (of the warp's kv head's GQ) whose q the lane reads: gid; at GQ = 4 a dummy lane reads head
// gid - 4's (in range: the warp's own kv head's q, which no warp writes after the q copy) and zeroes
// its A (attn_mma_q_dummy_zero): no select on the loads (selecting zero floats spilled 48 B in
// attend_chunk<4,4>, nvcc 13.0, the harness build; this none)
template <int GQ>
MKL_HD int attn_mma_q_head(int lane) { return GQ == 8 ? (lane >> 2) : ((lane >> 2) & (GQ - 1)); }

// scores: the block token whose K row the lane loads for n-tile nt (B's column gid)
MKL_HD int attn_mma_k_token(int nt, int lane) { return 8 * nt + (lane >> 2); }
// the first of the lane's 16 dims (of q and of its K rows): dims attn_mma_q_dim0 + 0..15
MKL_HD int attn_mma_q_dim0(int lane) { return 16 * (lane & 3); }
// the block token of a score D element: n-tile nt, element e (c_e: hi row; c_{e+2}: lo row)
MKL_HD int attn_mma_s_token(int nt, int lane, int e) { return 8 * nt + 2 * (lane & 3) + e; }
// P.V: the block token of k-step s's B register h (0: k rows 2 tig + e, 1: 2 tig + 8 + e), element e
MKL_HD int attn_mma_v_token(int s, int h, int lane, int e) { return 16 * s + 8 * h + 2 * (lane & 3) + e; }
// the first of the lane's 8 V dims of a token (one 16-B word): n-tile nt's column gid is dim v_dim0 + nt
MKL_HD int attn_mma_v_dim0(int lane) { return 8 * (lane >> 2); }
// the dim of a P.V D element: n-tile nt, element e (c_e: hi row; c_{e+2}: lo row)
MKL_HD int attn_mma_o_dim(int nt, int lane, int e) { return 16 * (lane & 3) + 8 * e + nt; }

// bf16 round to nearest even (finite inputs), as bits in the low half
MKL_HD uint32_t attn_mma_bf16_bits(float x) {
  union { float f; uint32_t u; } c;
  c.f = x;
  return (c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16;
}
MKL_HD float attn_mma_bf16_value(uint32_t bits) {
  union { float f; uint32_t u; } c;
  c.u = bits << 16;
  return c.f;
}
// (x, y) -> hi = bf16x2(x, y), lo = bf16x2(x - bf16(x), y - bf16(y)): x = hi + lo to ~2^-17 relative
MKL_HD void attn_mma_split(float x, float y, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  // the same rounding (cvt.rn.bf16x2.f32), one instruction a pair
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
#else
  const uint32_t hx = attn_mma_bf16_bits(x), hy = attn_mma_bf16_bits(y);
  hi = hx | (hy << 16);
  lo = attn_mma_bf16_bits(x - attn_mma_bf16_value(hx)) | (attn_mma_bf16_bits(y - attn_mma_bf16_value(hy)) << 16);
#endif
}
// the scores' A of k-steps 0..3 from the lane's 16 q floats (head gid, dims q_dim0 + 0..15)
MKL_HD void attn_mma_q_frags(const float* q16, uint32_t a[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    attn_mma_split(q16[4 * j], q16[4 * j + 1], a[j][0], a[j][1]);
    attn_mma_split(q16[4 * j + 2], q16[4 * j + 3], a[j][2], a[j][3]);
  }
}
// a dummy lane's scores' A zeroed (GQ = 4, gid >= 4; GQ = 8: nothing): rows gid and gid + 8 of every
// k-step become zero
template <int GQ>
MKL_HD void attn_mma_q_dummy_zero(int lane, uint32_t a[4][4]) {
  if (GQ != 8) {
    const uint32_t keep = attn_mma_real_head<GQ>(lane) ? 0xffffffffu : 0u;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) a[j][r] &= keep;
  }
}
// the scores' B of k-step j from the lane's 8 K words of a token (word w: dims q_dim0 + 2 w, + 1)
MKL_HD void attn_mma_k_frag(const uint32_t* kw8, int j, uint32_t b[2]) {
  b[0] = kw8[2 * j];
  b[1] = kw8[2 * j + 1];
}
// P.V's A of k-step s from the probabilities p[nt][e] of the lane's score elements (tokens
// attn_mma_s_token(nt, lane, e)): n-tile 2 s is A's cols 2 tig + e, n-tile 2 s + 1 its cols + 8
MKL_HD void attn_mma_p_frags(const float p[4][2], int s, uint32_t a[4]) {
  attn_mma_split(p[2 * s][0], p[2 * s][1], a[0], a[1]);
  attn_mma_split(p[2 * s + 1][0], p[2 * s + 1][1], a[2], a[3]);
}
// P.V's B register of n-tile nt from the V words (dims v_dim0 + 2 w, + 1; w = nt / 2) of the
// register's two tokens (e = 0: w0, e = 1: w1): their bf16 of dim v_dim0 + nt, w0's in the low half
MKL_HD uint32_t attn_mma_v_frag(uint32_t w0, uint32_t w1, int nt) {
  return (nt & 1) ? ((w0 >> 16) | (w1 & 0xffff0000u)) : ((w0 & 0xffffu) | (w1 << 16));
}

}  // namespace mkl
