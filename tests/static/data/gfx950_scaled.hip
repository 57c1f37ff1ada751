// The MI355 megakernel PR's hazard 2, its own instruction: a gfx950 scaled MFMA, then the
// 9-wait-state tail. clang-19 cannot target gfx950; compiled for gfx942 with -S the inline
// asm passes through unassembled, so the checks still see (and flag) the mnemonic.
#define __global__ __attribute__((global))
__global__ void scaled_tail9(float* out) {
  float r;
  asm volatile(
      "v_mfma_scale_f32_16x16x128_f8f6f4 a[0:3], v[0:7], v[8:15], a[0:3], v20, v21\n\t"
      "s_nop 7\n\t"
      "s_nop 0\n\t"
      "v_accvgpr_read_b32 %0, a0"
      : "=v"(r)
      :
      : "a0", "a1", "a2", "a3", "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9",
        "v10", "v11", "v12", "v13", "v14", "v15", "v20", "v21");
  out[0] = r;
}
