// mfma_pipeline.hip -- family `mfma_pipeline` (AMD): a software-pipelined MFMA loop in
// inline asm, the MI355 megakernel PR's own hazard pair ("Two register hazards in
// software-pipelined v_mfma_scale_f32_16x16x128_f8f6f4 loops").
//
// Hazards seeded (variants are -D parameters, the kernel text is mfma_kernel.inc):
//  1. WAR on MFMA sources (HZ_BANKS=1 HZ_OVERLAP=1): tile k+1 is ds_read into the VGPRs
//     the MFMA of tile k is still reading. lgkmcnt says when LDS data reach the VGPR, not
//     when the MFMA finished sampling its operands; the ISA has no counter for the latter.
//  2. Accumulator read before retirement (HZ_TAIL=9): "s_nop 7; s_nop 0" gives 9 wait
//     states before v_accvgpr_read_b32, but v_mfma_f32_32x32x8_f16 is an 8-pass op on
//     gfx942 and needs 8 + 3 = 11 (the 9-clock tail is right only for 4-pass shapes such
//     as v_mfma_f32_16x16x16_f16: HZ_SHAPE=16).
//  3. Exit parity (HZ_EXIT_TAILS=1): with two banks, an odd tile count leaves the last
//     tile in bank 0 and an even one in bank 1; one shared tail consumes the wrong bank at
//     one parity.
// HZ_SHAPE=128 builds the same schedules on the MI355 PR's own op (gfx950 only, static).
// Why the fixed variant is correct: two disjoint operand banks, ping-ponged, so no
// register is ever both a source of an in-flight MFMA and an LDS destination (a bank is
// reloaded only after the next MFMA - which depends on the previous one through the
// accumulator - has issued); a 32-wait-state tail (s_nop 15 x2, >= 11); and one tail per
// exit parity. The reference does not overlap at all.
//
// Static build (hazards.static): clang-19 -x hip --offload-arch=gfx942 -nogpulib
// -nogpuinc --cuda-device-only -O3 -S -DHZ_STATIC_ONLY. With hipcc on AMD hardware the
// host harness below runs the reference and the variant on the same data at both parities
// (default 23 and 22 tiles) and requires bit-exact agreement; THAT RUNTIME PATH HAS NOT
// BEEN RUN (no AMD GPU or ROCm on the project's machines). The same source is built for
// gfx950 with clang-22 (clang-19 rejects the processor) and judged on that listing.
#if defined(HZ_STATIC_ONLY)
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
typedef __SIZE_TYPE__ size_t;
#else
#include <hip/hip_runtime.h>
#endif

#ifndef HZ_SHAPE
#define HZ_SHAPE 32
#endif
#ifndef HZ_BANKS
#define HZ_BANKS 2
#endif
#ifndef HZ_OVERLAP
#define HZ_OVERLAP 1
#endif
#ifndef HZ_EXIT_TAILS
#define HZ_EXIT_TAILS 2
#endif
#ifndef HZ_TAIL
#define HZ_TAIL 32
#endif
#define HZ_MAX_TILES 32

typedef __attribute__((address_space(3))) const unsigned long long* hz_lds_ptr;

#define HZ_ACC_READ4(i0, i1, i2, i3)                                                    \
  "v_accvgpr_read_b32 %[c" #i0 "], a" #i0 "\n v_accvgpr_read_b32 %[c" #i1 "], a" #i1   \
  "\n v_accvgpr_read_b32 %[c" #i2 "], a" #i2 "\n v_accvgpr_read_b32 %[c" #i3 "], a" #i3 "\n"
#define HZ_ACC_ZERO4(i0, i1, i2, i3)                                                     \
  "v_accvgpr_write_b32 a" #i0 ", 0\n v_accvgpr_write_b32 a" #i1 ", 0\n v_accvgpr_write_b32 a" \
  #i2 ", 0\n v_accvgpr_write_b32 a" #i3 ", 0\n"
#define HZ_ACC_OUT4(i0, i1, i2, i3) \
  [c##i0] "=v"(c[i0]), [c##i1] "=v"(c[i1]), [c##i2] "=v"(c[i2]), [c##i3] "=v"(c[i3])

#if HZ_SHAPE == 32
#define HZ_MFMA "v_mfma_f32_32x32x8_f16"
#define HZ_ACC "a[0:15]"
#define HZ_ACC_REGS 16
#define HZ_ZERO_ACC HZ_ACC_ZERO4(0, 1, 2, 3) HZ_ACC_ZERO4(4, 5, 6, 7) \
  HZ_ACC_ZERO4(8, 9, 10, 11) HZ_ACC_ZERO4(12, 13, 14, 15)
#define HZ_READ_ACC HZ_ACC_READ4(0, 1, 2, 3) HZ_ACC_READ4(4, 5, 6, 7) \
  HZ_ACC_READ4(8, 9, 10, 11) HZ_ACC_READ4(12, 13, 14, 15)
#define HZ_ACC_OUTPUTS HZ_ACC_OUT4(0, 1, 2, 3), HZ_ACC_OUT4(4, 5, 6, 7), \
  HZ_ACC_OUT4(8, 9, 10, 11), HZ_ACC_OUT4(12, 13, 14, 15)
#elif HZ_SHAPE == 16
#define HZ_MFMA "v_mfma_f32_16x16x16_f16"
#define HZ_ACC "a[0:3]"
#define HZ_ACC_REGS 4
#define HZ_ZERO_ACC HZ_ACC_ZERO4(0, 1, 2, 3)
#define HZ_READ_ACC HZ_ACC_READ4(0, 1, 2, 3)
#define HZ_ACC_OUTPUTS HZ_ACC_OUT4(0, 1, 2, 3)
#elif HZ_SHAPE == 128
// The MI355 PR's own op (gfx950 only; static build only - the host harness below fills
// f16 tiles): v_mfma_scale_f32_16x16x128_f8f6f4, 8 passes with f8 operands (needs 12 wait
// states before v_accvgpr_read on gfx950). A and B are 8 VGPRs each (two ds_read_b128),
// the E8M0 scales v50/v51 (127: 1.0). Banks: 0 = v[52:59] (A), v[60:67] (B); 1 = v[68:75],
// v[76:83].
#if !defined(HZ_STATIC_ONLY)
#error "HZ_SHAPE 128 is built for the static checks only (-DHZ_STATIC_ONLY, gfx950)"
#endif
#define HZ_MFMA "v_mfma_scale_f32_16x16x128_f8f6f4"
#define HZ_ACC "a[0:3]"
#define HZ_ACC_REGS 4
#define HZ_ZERO_ACC "v_mov_b32 v50, 0x7f\n v_mov_b32 v51, 0x7f\n" HZ_ACC_ZERO4(0, 1, 2, 3)
#define HZ_READ_ACC HZ_ACC_READ4(0, 1, 2, 3)
#define HZ_ACC_OUTPUTS HZ_ACC_OUT4(0, 1, 2, 3)
#define HZ_LOAD_B0 "ds_read_b128 v[52:55], v48\n ds_read_b128 v[56:59], v48 offset:16\n" \
                   "ds_read_b128 v[60:63], v49\n ds_read_b128 v[64:67], v49 offset:16\n"
#define HZ_LOAD_B1 "ds_read_b128 v[68:71], v48\n ds_read_b128 v[72:75], v48 offset:16\n" \
                   "ds_read_b128 v[76:79], v49\n ds_read_b128 v[80:83], v49 offset:16\n"
#define HZ_MFMA_B0 HZ_MFMA " " HZ_ACC ", v[52:59], v[60:67], " HZ_ACC ", v50, v51\n"
#define HZ_MFMA_B1 HZ_MFMA " " HZ_ACC ", v[68:75], v[76:83], " HZ_ACC ", v50, v51\n"
#define HZ_MORE_CLOBBERS , "v50", "v51", "v52", "v53", "v54", "v55", "v56", "v57", "v58", "v59", \
  "v60", "v61", "v62", "v63", "v64", "v65", "v66", "v67", "v68", "v69", "v70", "v71", "v72", \
  "v73", "v74", "v75", "v76", "v77", "v78", "v79", "v80", "v81", "v82", "v83"
#else
#error "HZ_SHAPE must be 32 (v_mfma_f32_32x32x8_f16), 16 (v_mfma_f32_16x16x16_f16) or 128 (gfx950's scaled f8f6f4)"
#endif

#define HZ_TAIL_32 "s_nop 15\n s_nop 15\n"
#define HZ_TAIL_11 "s_nop 7\n s_nop 2\n"
#define HZ_TAIL_9 "s_nop 7\n s_nop 0\n"
#define HZ_TAIL_OF(n) HZ_TAIL_OF_(n)
#define HZ_TAIL_OF_(n) HZ_TAIL_##n

// The reference schedule, always built alongside the variant (the runtime oracle).
#define HZ_KERNEL_NAME hz_mfma_reference
#define HZ_K_BANKS 1
#define HZ_K_OVERLAP 0
#define HZ_K_EXIT_TAILS 1
#define HZ_K_TAIL HZ_TAIL_32
#include "mfma_kernel.inc"
#undef HZ_KERNEL_NAME
#undef HZ_K_BANKS
#undef HZ_K_OVERLAP
#undef HZ_K_EXIT_TAILS
#undef HZ_K_TAIL

// The variant this build selects.
#define HZ_KERNEL_NAME hz_mfma_variant
#define HZ_K_BANKS HZ_BANKS
#define HZ_K_OVERLAP HZ_OVERLAP
#define HZ_K_EXIT_TAILS HZ_EXIT_TAILS
#define HZ_K_TAIL HZ_TAIL_OF(HZ_TAIL)
#include "mfma_kernel.inc"

#if !defined(HZ_STATIC_ONLY)
// Host harness (hipcc, AMD GPU): `mfma_pipeline [blocks] [tiles...]`, default 300 blocks
// at 23 and 22 tiles. Exit 0 bit-exact, 1 mismatch, 2 bad input, 3 device error; one
// `HZ_RESULT {json}` line per tile count (docs/protocol.md).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define HZ_CHECK(call)                                                         \
  do {                                                                         \
    hipError_t e_ = (call);                                                    \
    if (e_ != hipSuccess) {                                                    \
      printf("HZ_RESULT {\"status\": \"fault\", \"message\": \"%s\"}\n",       \
             hipGetErrorString(e_));                                           \
      exit(3);                                                                 \
    }                                                                          \
  } while (0)

static int run_parity(int blocks, int tiles) {
  const size_t n_in = (size_t)blocks * tiles * 64;
  const size_t n_out = (size_t)blocks * 64 * HZ_ACC_REGS;
  unsigned long long* h_in = (unsigned long long*)malloc(2 * n_in * sizeof(unsigned long long));
  float* h_ref = (float*)malloc(n_out * sizeof(float));
  float* h_var = (float*)malloc(n_out * sizeof(float));
  unsigned long long state = 0x9E3779B97F4A7C15ull ^ (unsigned long long)tiles;
  for (size_t i = 0; i < 2 * n_in; ++i) {  // four halves in [-2, 2), exact in f16
    unsigned long long v = 0;
    for (int h = 0; h < 4; ++h) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      _Float16 x = (_Float16)((int)(state >> 58) - 32) * (_Float16)0.0625f;
      unsigned short bits;
      memcpy(&bits, &x, 2);
      v |= (unsigned long long)bits << (16 * h);
    }
    h_in[i] = v;
  }
  unsigned long long *d_a, *d_b;
  float *d_ref, *d_var;
  HZ_CHECK(hipMalloc((void**)&d_a, n_in * 8));
  HZ_CHECK(hipMalloc((void**)&d_b, n_in * 8));
  HZ_CHECK(hipMalloc((void**)&d_ref, n_out * 4));
  HZ_CHECK(hipMalloc((void**)&d_var, n_out * 4));
  HZ_CHECK(hipMemcpy(d_a, h_in, n_in * 8, hipMemcpyHostToDevice));
  HZ_CHECK(hipMemcpy(d_b, h_in + n_in, n_in * 8, hipMemcpyHostToDevice));
  hipLaunchKernelGGL(hz_mfma_reference, dim3(blocks), dim3(64), 0, 0, d_a, d_b, d_ref, tiles);
  HZ_CHECK(hipGetLastError());
  hipLaunchKernelGGL(hz_mfma_variant, dim3(blocks), dim3(64), 0, 0, d_a, d_b, d_var, tiles);
  HZ_CHECK(hipGetLastError());
  HZ_CHECK(hipDeviceSynchronize());
  HZ_CHECK(hipMemcpy(h_ref, d_ref, n_out * 4, hipMemcpyDeviceToHost));
  HZ_CHECK(hipMemcpy(h_var, d_var, n_out * 4, hipMemcpyDeviceToHost));
  int bad_blocks = 0;
  double max_rel = 0.0;
  for (int blk = 0; blk < blocks; ++blk) {
    const size_t base = (size_t)blk * 64 * HZ_ACC_REGS;
    if (memcmp(h_ref + base, h_var + base, 64 * HZ_ACC_REGS * sizeof(float)) != 0) ++bad_blocks;
    for (size_t i = base; i < base + 64 * HZ_ACC_REGS; ++i) {
      double d = fabs((double)h_ref[i] - (double)h_var[i]);
      double r = d / fmax(fabs((double)h_ref[i]), 1e-6);
      if (r > max_rel) max_rel = r;
    }
  }
  printf("HZ_RESULT {\"status\": \"ok\", \"tiles\": %d, \"launches\": %d, \"mismatched\": %d, "
         "\"max_rel_err\": %.6g}\n", tiles, blocks, bad_blocks, max_rel);
  hipFree(d_a);
  hipFree(d_b);
  hipFree(d_ref);
  hipFree(d_var);
  free(h_in);
  free(h_ref);
  free(h_var);
  return bad_blocks;
}

int main(int argc, char** argv) {
  int blocks = argc > 1 ? atoi(argv[1]) : 300;
  if (blocks <= 0) {
    printf("HZ_RESULT {\"status\": \"bad_request\", \"message\": \"blocks must be > 0\"}\n");
    return 2;
  }
  int tiles_list[16] = {23, 22};
  int n_tiles = 2;
  if (argc > 2) {
    n_tiles = 0;
    for (int i = 2; i < argc && n_tiles < 16; ++i) tiles_list[n_tiles++] = atoi(argv[i]);
  }
  int mismatched = 0;
  for (int i = 0; i < n_tiles; ++i) {
    if (tiles_list[i] < 1 || tiles_list[i] > HZ_MAX_TILES) {
      printf("HZ_RESULT {\"status\": \"bad_request\", \"message\": \"tiles must be 1..%d\"}\n",
             HZ_MAX_TILES);
      return 2;
    }
    mismatched += run_parity(blocks, tiles_list[i]);
  }
  return mismatched ? 1 : 0;
}
#endif
