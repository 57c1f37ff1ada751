"""Campaign step (m) (MKL_CAMPAIGN_STEP 15, candidate step_m; production since round 20): step 14 with
attend_chunk's 32-token block loop on tensor cores at both compiled head groupings, GQ = 8 and GQ = 4
(MKL_ATTN_MMA: mma.sync.m16n8k16 bf16 in, fp32 accumulate; q and P split into bf16 hi + lo rows; at
GQ = 4 the A rows of heads 4-7 are zero dummies; mkl_kernel.cuh's attend_blocks_mma).

On the CPU: a host C++ program includes mkl_attn_mma.h (the maps and fragment builders the kernel
uses) and runs a warp's blocks lane by lane as attend_blocks_mma does, each mma.sync emulated from
the PTX ISA's m16n8k16 .bf16 fragment layout (written here from the ISA's figures, not from the
header): the per-head (m, l, acc) must match plain loops in double to the hi/lo split's accuracy,
over a full block and a partial one (masked tokens; V rows past the end are NaN, so reading one
fails, and a NaN anywhere fails the check), at GQ 8 and 4. The host builds the hi/lo split with its
own rounding (mkl_attn_mma.h's #else branch); the device's (__floats2bfloat162_rn, .x in the low
half) is read, not emulated: the GPU test covers it. Broken maps
(the header text mutated: a wrong dim, token or half; at GQ 4 a dummy row read, kept or written)
must make it fail. The build: step 15's attend_chunk<8,8> and <4,4> have the 32 HMMA a block (16
scores, 16 P.V), step 14's none (step 15 was production's machine code from promote15 until step 21: test_production_step22.py);
step 15 changes no switch of step 14's but MKL_ATTN_MMA and the compiled static checks pass with
step 14's polls.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

from hazards.megakernel_layers import faithful as FA

from .sass_text import function_instances, spills_by_function, spills_grown
from .test_merge_spread import ROOT, assert_static_checks_pass_with_the_polls_of, family_cubin, listing_of
from .test_production_step22 import switches_changed_from_step_14

FAMILY = ROOT / "standalone" / "megakernel_layers"
HEADER = FAMILY / "mkl_attn_mma.h"

EMULATOR = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mkl_attn_mma.h"
using namespace mkl;

// ---- the PTX ISA's mma.m16n8k16 fragments for .bf16 (element i; register r holds elements 2r, 2r + 1,
// the lower one in the low half); gid = lane >> 2, tig = lane % 4
static int a_row(int lane, int i) { return (lane >> 2) + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0); }
static int a_col(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 4 ? 8 : 0); }
static int b_row(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 2 ? 8 : 0); }
static int b_col(int lane, int) { return lane >> 2; }
static int c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
static int c_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }
static float half_of(uint32_t reg, int i) { return attn_mma_bf16_value((i & 1) ? reg >> 16 : reg & 0xffffu); }

// one warp's mma.sync: a[lane][4], b[lane][2], c[lane][4] += A B (sums in double, rounded once)
static void mma(const uint32_t a[32][4], const uint32_t b[32][2], float c[32][4]) {
  double A[16][16], B[16][8];
  int seen_a[16][16] = {}, seen_b[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) { A[a_row(lane, i)][a_col(lane, i)] = half_of(a[lane][i / 2], i); ++seen_a[a_row(lane, i)][a_col(lane, i)]; }
    for (int i = 0; i < 4; ++i) { B[b_row(lane, i)][b_col(lane, i)] = half_of(b[lane][i / 2], i); ++seen_b[b_row(lane, i)][b_col(lane, i)]; }
  }
  for (int r = 0; r < 16; ++r) for (int k = 0; k < 16; ++k) if (seen_a[r][k] != 1) { std::printf("A layout\n"); std::exit(3); }
  double D[16][8];
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      double s = 0;
      for (int k = 0; k < 16; ++k) s += A[r][k] * B[k][n];
      D[r][n] = s;
    }
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) c[lane][i] = (float)((double)c[lane][i] + D[c_row(lane, i)][c_col(lane, i)]);
}

static uint32_t rng = 12345u;
static float urand() { rng = rng * 1664525u + 1013904223u; return (float)((rng >> 8) * (1.0 / 16777216.0)) * 2.f - 1.f; }

int main() {
  const int T = 32 + NTAIL;  // a full block, then a partial one
  // the kv head's NGQ q rows; rows NGQ.. stand for what follows them in shared memory (the next kv
  // head's q, the scratch), poisoned: a dummy lane (NGQ = 4, gid >= 4) must not read them
  float q[8][HD];
  // bf16 bits; rows >= T poisoned: K's with a huge value (a masked score is -inf whatever it reads),
  // V's with NaN (a V row read past the end turns 0 x NaN into NaN, which the check below fails)
  uint16_t K[64][HD], V[64][HD];
  for (int g = 0; g < 8; ++g) for (float& x : q[g]) x = g < NGQ ? urand() * 2.f : NAN;
  for (int t = 0; t < 64; ++t)
    for (int d = 0; d < HD; ++d) {
      K[t][d] = (uint16_t)attn_mma_bf16_bits(t < T ? urand() * 2.f : 1e30f);
      V[t][d] = t < T ? (uint16_t)attn_mma_bf16_bits(urand()) : (uint16_t)0x7fc0u;  // bf16 NaN
    }
  auto word = [](const uint16_t* row, int d) { return (uint32_t)row[d] | ((uint32_t)row[d + 1] << 16); };
  const float scale = 0.125f;
  float mh[32], lh[32], o[32][8][4];
  for (int lane = 0; lane < 32; ++lane) { mh[lane] = -INFINITY; lh[lane] = 0.f; std::memset(o[lane], 0, sizeof o[lane]); }
  for (int base = 0; base < T; base += 32) {
    const int ntok = T - base < 32 ? T - base : 32;
    static uint32_t qa[32][4][4], kw[32][4][8];
    for (int lane = 0; lane < 32; ++lane) {
      // as attend_blocks_mma: the 16 q floats of head attn_mma_q_head (gid; a dummy lane's: a real
      // head's of the kv head), split, a dummy lane's A zeroed
      const int qh = attn_mma_q_head<NGQ>(lane);
      if (qh < 0 || qh >= NGQ) { std::printf("lane %d reads head %d of a kv head with %d\n", lane, qh, NGQ); return 6; }
      attn_mma_q_frags(&q[qh][attn_mma_q_dim0(lane)], qa[lane]);
      attn_mma_q_dummy_zero<NGQ>(lane, qa[lane]);
      if ((lane >> 2) >= NGQ)
        for (auto& r : qa[lane]) for (uint32_t x : r) if (x != 0u) { std::printf("dummy lane %d: A row not zero\n", lane); return 4; }
      for (int nt = 0; nt < 4; ++nt) {
        const int tk = attn_mma_k_token(nt, lane);
        const uint16_t* row = K[base + (tk < ntok ? tk : 0)] + attn_mma_q_dim0(lane);
        for (int w = 0; w < 8; ++w) kw[lane][nt][w] = word(row, 2 * w);
      }
    }
    float p[32][4][2];
    for (int nt = 0; nt < 4; ++nt) {
      float c[32][4] = {};
      for (int j = 0; j < 4; ++j) {
        uint32_t a[32][4], b[32][2];
        for (int lane = 0; lane < 32; ++lane) { std::memcpy(a[lane], qa[lane][j], sizeof a[lane]); attn_mma_k_frag(kw[lane][nt], j, b[lane]); }
        mma(a, b, c);
      }
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 2; ++e) {
          const float sv = (c[lane][e] + c[lane][e + 2]) * scale;
          p[lane][nt][e] = attn_mma_s_token(nt, lane, e) < ntok ? sv : -INFINITY;
        }
    }
    float mx[32];
    for (int lane = 0; lane < 32; ++lane) { mx[lane] = -INFINITY; for (auto& pn : p[lane]) for (float v : pn) mx[lane] = std::fmax(mx[lane], v); }
    for (int sh : {1, 2}) { float t[32]; for (int l = 0; l < 32; ++l) t[l] = std::fmax(mx[l], mx[l ^ sh]); std::memcpy(mx, t, sizeof t); }
    static uint32_t vw[32][2][2][2][4];
    for (int lane = 0; lane < 32; ++lane) {
      for (int s2 = 0; s2 < 2; ++s2) for (int h = 0; h < 2; ++h) for (int e = 0; e < 2; ++e) {
        const int tk = attn_mma_v_token(s2, h, lane, e);
        for (int w = 0; w < 4; ++w) vw[lane][s2][h][e][w] = tk < ntok ? word(V[base + tk] + attn_mma_v_dim0(lane), 2 * w) : 0u;
      }
      const float mn = std::fmax(mh[lane], mx[lane]);
      const float alpha = std::exp(mh[lane] - mn);
      float ps = 0.f;
      for (int nt = 0; nt < 4; ++nt) for (int e = 0; e < 2; ++e) {
        p[lane][nt][e] = std::exp(p[lane][nt][e] - mn);  // a masked score is -inf: 0
        ps += p[lane][nt][e];
      }
      lh[lane] = lh[lane] * alpha + ps;
      mh[lane] = mn;
      for (auto& on : o[lane]) for (float& v : on) v *= alpha;
    }
    for (int s2 = 0; s2 < 2; ++s2)
      for (int nt = 0; nt < 8; ++nt) {
        uint32_t a[32][4], b[32][2];
        float c[32][4];
        for (int lane = 0; lane < 32; ++lane) {
          attn_mma_p_frags(p[lane], s2, a[lane]);
          for (int h = 0; h < 2; ++h) b[lane][h] = attn_mma_v_frag(vw[lane][s2][h][0][nt >> 1], vw[lane][s2][h][1][nt >> 1], nt);
          std::memcpy(c[lane], o[lane][nt], sizeof c[lane]);
        }
        mma(a, b, c);
        for (int lane = 0; lane < 32; ++lane) std::memcpy(o[lane][nt], c[lane], sizeof c[lane]);
      }
  }
  // the warp's (m, l, acc) per head, as attend_blocks_mma writes its scratch slots
  float M[8], L[8], acc[8][HD];
  int seen[8][HD] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2;
    if (!attn_mma_real_head<NGQ>(lane)) continue;  // a dummy lane writes nothing
    if (g >= NGQ) { std::printf("lane %d writes head %d of a kv head with %d\n", lane, g, NGQ); return 5; }
    if ((lane & 3) == 0) { M[g] = mh[lane]; L[g] = lh[lane] + lh[lane ^ 1] + lh[lane ^ 2] + lh[lane ^ 3]; }
    for (int nt = 0; nt < 8; ++nt) for (int e = 0; e < 2; ++e) {
      acc[g][attn_mma_o_dim(nt, lane, e)] = o[lane][nt][e] + o[lane][nt][e + 2];
      ++seen[g][attn_mma_o_dim(nt, lane, e)];
    }
  }
  double worst = 0;
  auto upd = [&worst](double e) { if (!(e <= worst)) worst = e; };  // a NaN error reaches worst (fmax would drop it)
  for (int g = 0; g < NGQ; ++g) {
    double s[64], m = -INFINITY, l = 0;
    for (int t = 0; t < T; ++t) {
      s[t] = 0;
      for (int d = 0; d < HD; ++d) s[t] += (double)q[g][d] * attn_mma_bf16_value(K[t][d]);
      s[t] *= scale;
      m = std::fmax(m, s[t]);
    }
    for (int t = 0; t < T; ++t) l += std::exp(s[t] - m);
    upd(std::fabs(M[g] - m) / (std::fabs(m) + 1e-3));
    upd(std::fabs(L[g] - l) / l);
    for (int d = 0; d < HD; ++d) {
      double a = 0;
      for (int t = 0; t < T; ++t) a += std::exp(s[t] - m) * attn_mma_bf16_value(V[t][d]);
      if (seen[g][d] != 1) { std::printf("dim %d of head %d written %d times\n", d, g, seen[g][d]); return 2; }
      upd(std::fabs(acc[g][d] / L[g] - a / l));
    }
  }
  std::printf("worst %.3e\n", worst);
  return worst < 2e-5 ? 0 : 1;
}
"""


def _run_emulator(tmp_path, header_text: str | None = None, ntail: int = 19, gq: int = 8) -> subprocess.CompletedProcess:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    inc = tmp_path / "inc"
    inc.mkdir(exist_ok=True)
    shutil.copy(FAMILY / "mkl_model.h", inc / "mkl_model.h")
    (inc / "mkl_attn_mma.h").write_text(header_text if header_text is not None else HEADER.read_text())
    src, exe = tmp_path / "emulate.cpp", tmp_path / "emulate"
    src.write_text(EMULATOR)
    built = subprocess.run([cxx, "-std=c++17", "-O1", f"-DNTAIL={ntail}", f"-DNGQ={gq}", f"-I{inc}", str(src), "-o", str(exe)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("gq", [8, 4])
@pytest.mark.parametrize("ntail", [19, 1, 32])
def test_emulated_warp_matches_plain_attention_over_full_and_partial_blocks(tmp_path, ntail, gq):
    """Both compiled head groupings: GQ = 8 (the default shape) and GQ = 4 (small: lanes with gid >= 4
    hold zero dummy rows, read no q and write nothing)."""
    r = _run_emulator(tmp_path, ntail=ntail, gq=gq)
    assert r.returncode == 0, r.stdout + r.stderr
    worst = float(r.stdout.split()[-1])
    assert worst < 2e-5, worst  # the hi/lo split: ~2^-17 relative a product


# Each mutation breaks one map or builder the way a fragment bug would (a text in the header -> its
# wrong form); the emulated warp must then disagree with the plain loops.
BROKEN_MAPS = {
    "k_token_gid_tig_swapped": ("return 8 * nt + (lane >> 2); }", "return 8 * nt + 2 * (lane & 3); }"),
    "score_token_pairs": ("return 8 * nt + 2 * (lane & 3) + e; }", "return 8 * nt + (lane & 3) + 4 * e; }"),
    "v_token_halves": ("return 16 * s + 8 * h + 2 * (lane & 3) + e; }", "return 16 * s + h + 2 * (lane & 3) + 8 * e; }"),
    "out_dim_order": ("return 16 * (lane & 3) + 8 * e + nt; }", "return 16 * (lane & 3) + 2 * nt + e; }"),
    "v_frag_halves": ("(w0 & 0xffffu) | (w1 << 16)", "(w1 & 0xffffu) | (w0 << 16)"),
    # (swapping a register's hi and lo rows is no bug: the two rows are summed)
    "q_frag_regs": ("attn_mma_split(q16[4 * j], q16[4 * j + 1], a[j][0], a[j][1]);\n    "
                    "attn_mma_split(q16[4 * j + 2], q16[4 * j + 3], a[j][2], a[j][3]);",
                    "attn_mma_split(q16[4 * j], q16[4 * j + 1], a[j][0], a[j][2]);\n    "
                    "attn_mma_split(q16[4 * j + 2], q16[4 * j + 3], a[j][1], a[j][3]);"),
    "k_frag_words": ("b[0] = kw8[2 * j];\n  b[1] = kw8[2 * j + 1];", "b[0] = kw8[j];\n  b[1] = kw8[j + 4];"),
    "p_frag_tiles": ("attn_mma_split(p[2 * s][0], p[2 * s][1], a[0], a[1]);\n  attn_mma_split(p[2 * s + 1][0], p[2 * s + 1][1], a[2], a[3]);",
                     "attn_mma_split(p[2 * s][0], p[2 * s][1], a[0], a[2]);\n  attn_mma_split(p[2 * s + 1][0], p[2 * s + 1][1], a[1], a[3]);"),
    "no_lo_part": ("lo = attn_mma_bf16_bits(x - attn_mma_bf16_value(hx))", "lo = 0u * attn_mma_bf16_bits(x - attn_mma_bf16_value(hx))"),
}


# GQ = 4's dummy rows broken: lanes of heads 4-7 taken for real ones (their A rows kept, their slots
# written: another warp's), one taken too many, real heads taken for dummies (never written), a dummy
# lane reading q past its kv head's, or its A not zeroed.
BROKEN_DUMMY_ROWS = {
    "every_lane_real": ("return GQ == 8 || (lane >> 2) < GQ; }", "return true; }"),
    "one_head_too_many": ("return GQ == 8 || (lane >> 2) < GQ; }", "return GQ == 8 || (lane >> 2) <= GQ; }"),
    "half_the_heads": ("return GQ == 8 || (lane >> 2) < GQ; }", "return GQ == 8 || (lane >> 2) < GQ / 2; }"),
    "q_past_the_kv_head": ("((lane >> 2) & (GQ - 1))", "(lane >> 2)"),
    "dummy_a_kept": ("? 0xffffffffu : 0u;", "? 0xffffffffu : 0xffffffffu;"),
}


@pytest.mark.parametrize("name, gq", [(n, g) for n in sorted(BROKEN_MAPS) for g in (8, 4)]
                         + [(n, 4) for n in sorted(BROKEN_DUMMY_ROWS)])
def test_a_broken_fragment_map_makes_the_emulated_warp_disagree(tmp_path, name, gq):
    """Every map broken at both head groupings; GQ 4's dummy-row handling broken at GQ 4."""
    old, new = {**BROKEN_MAPS, **BROKEN_DUMMY_ROWS}[name]
    text = HEADER.read_text()
    assert text.count(old) == 1, name
    r = _run_emulator(tmp_path, text.replace(old, new), gq=gq)
    assert r.returncode != 0, (name, r.stdout)


def test_step_m_attention_chunk_runs_its_blocks_on_tensor_cores_step_14_none():
    step = listing_of(family_cubin({"MKL_CAMPAIGN_STEP": 15}, "test-mkl-step-15"))
    prod = listing_of(family_cubin({"MKL_CAMPAIGN_STEP": 14}, "test-mkl-step-14"))
    big = [f.splitlines() for f in function_instances(step, "attend_chunkILi8ELi8E")]
    small = [f.splitlines() for f in function_instances(step, "attend_chunkILi4ELi4E")]
    assert len(big) == 2 and len(small) == 2, (len(big), len(small))  # the kernel with the tripwire in and out
    for fn in big:  # 16 mma for the scores and 16 for P.V a block, bf16 in, fp32 accumulate
        hmma = [x for x in fn if "HMMA" in x]
        assert len(hmma) == 32 and all("HMMA.16816.F32.BF16" in x for x in hmma), hmma[:3]
    for fn in small:  # GQ = 4 (small shape): the same loop, half of A's rows zero dummies
        hmma = [x for x in fn if "HMMA" in x]
        assert len(hmma) == 32 and all("HMMA.16816.F32.BF16" in x for x in hmma), hmma[:3]
    assert "HMMA" not in prod


def test_step_m_attention_chunk_spills_no_more_than_step_14_in_the_harness_build():
    """In the build the GPU runs (stress/build.py's flags, ptxas -v) step 15's attend_chunk<8,8> and
    <4,4> spill no more than step 14's (its base, production until step 15). (Not every function: the
    kernel body's spills grow with every block loop variant tried, 454 / 1724 B against step 14's
    410 / 1424, a whole-program allocation effect; megakernel-layers.md's step (m) paragraph.)"""
    from .test_copy_ahead import _harness_build

    def spills(cubin) -> dict[str, tuple[int, int]]:
        return {k: v for k, v in spills_by_function(cubin.log).items() if "attend_chunk" in k}

    prod = spills(_harness_build({"MKL_CAMPAIGN_STEP": 14}, "test-mkl-harness-step-14"))
    step = spills(_harness_build({"MKL_CAMPAIGN_STEP": 15}, "test-mkl-harness-step-15"))
    assert len(prod) == 2 and set(prod) == set(step), sorted(step)
    worse = spills_grown(prod, step)
    assert not worse, worse


def test_step_m_passes_the_compiled_static_checks_with_step_14_polls():
    assert_static_checks_pass_with_the_polls_of(15, 14)


def test_step_m_is_step_14_but_for_the_attention_mma_and_step_15_code_in_the_catalog():
    c = FA.candidate("step_m")
    assert dict(c.defines) == {"MKL_CAMPAIGN_STEP": 15} and c.params == ()
    # faster in round 19, promoted in round 20; production's code until step 21 (step_15's), then slower (predicted)
    assert c.expected == "slower" and "production's code from step 15 until step 21" in c.what
    changed, _, step = switches_changed_from_step_14({"MKL_CAMPAIGN_STEP": 15})
    assert changed == {"MKL_CAMPAIGN_STEP", "MKL_ATTN_MMA"}, changed
    assert step["MKL_ATTN_MMA"] == 1 and step["MKL_COPY_AHEAD"] == 1 and step["MKL_W2_QUANT_AHEAD"] == 1
