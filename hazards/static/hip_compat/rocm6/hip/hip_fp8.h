// gpu-hazards' own minimal stand-in for ROCm 6's <hip/hip_fp8.h> (see hip_bf16.h beside it):
// the 8-bit float storage types and the names of the OCP (e4m3, e5m2) and FNUZ formats, with
// conversions through float written for this project (saturating to the format's largest
// finite value). Only what is declared here exists.
#pragma once
#if __has_include_next(<hip/hip_fp8.h>)  // a HIP that has it (ROCm 6 and later): the real one
#include_next <hip/hip_fp8.h>
#else
#include <hip/hip_runtime.h>
#include <stdint.h>

// which 8-bit float formats the target has in hardware: FNUZ on gfx94x, OCP on gfx950 (and later)
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define HIP_FP8_TYPE_FNUZ 1
#define HIP_FP8_TYPE_OCP 0
#elif defined(__gfx950__)
#define HIP_FP8_TYPE_FNUZ 0
#define HIP_FP8_TYPE_OCP 1
#else
#define HIP_FP8_TYPE_FNUZ 0
#define HIP_FP8_TYPE_OCP 0
#endif

typedef unsigned char __hip_fp8_storage_t;
typedef unsigned short __hip_fp8x2_storage_t;
typedef unsigned int __hip_fp8x4_storage_t;
enum __hip_saturation_t { __HIP_NOSAT = 0, __HIP_SATFINITE = 1 };
enum __hip_fp8_interpretation_t { __HIP_E4M3_FNUZ = 0, __HIP_E5M2_FNUZ = 1, __HIP_E4M3 = 2, __HIP_E5M2 = 3 };

#define HZ_FP8_FN __attribute__((host, device)) inline

// float -> 8 bits with `man` mantissa bits and exponent bias `bias`; `fnuz`: no negative
// zero, the NaN is 0x80 (else e4m3: 0x7f, e5m2: infinities kept)
HZ_FP8_FN __hip_fp8_storage_t hz_fp8_from_float(float f, int man, int bias, bool fnuz, float max) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  unsigned sign = (u >> 24) & 0x80u;
  if (f != f) return fnuz ? 0x80 : (__hip_fp8_storage_t)(sign | 0x7f);
  float a = f < 0 ? -f : f;
  if (a > max) a = max;
  if (a == 0.0f) return fnuz ? 0 : (__hip_fp8_storage_t)sign;
  int e;
  float m = __builtin_frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1 + bias;
  float scaled = exp > 0 ? (m * 2.0f - 1.0f) * (float)(1 << man) : a * __builtin_ldexpf(1.0f, bias - 1 + man);
  if (exp <= 0) exp = 0;
  unsigned q = (unsigned)__builtin_rintf(scaled);
  if (q >> man) { q = 0; ++exp; }
  unsigned bits = ((unsigned)exp << man) | q;
  if (bits == 0 && fnuz) return 0;
  return (__hip_fp8_storage_t)(sign | bits);
}
HZ_FP8_FN float hz_fp8_to_float(__hip_fp8_storage_t v, int man, int bias, bool fnuz) {
  if (fnuz && v == 0x80) return __builtin_nanf("");
  unsigned sign = v & 0x80u, exp = (v & 0x7fu) >> man, q = v & ((1u << man) - 1u);
  float a = exp ? __builtin_ldexpf(1.0f + (float)q / (float)(1 << man), (int)exp - bias)
                : __builtin_ldexpf((float)q / (float)(1 << man), 1 - bias);
  return sign ? -a : a;
}

#define HZ_FP8_TYPE(name, x2, x4, man, bias, fnuz, max)                                                \
  struct name {                                                                                  \
    __hip_fp8_storage_t __x;                                                                     \
    name() = default;                                                                            \
    HZ_FP8_FN name(float f) : __x(hz_fp8_from_float(f, man, bias, fnuz, max)) {}                 \
    HZ_FP8_FN operator float() const { return hz_fp8_to_float(__x, man, bias, fnuz); }           \
  };                                                                                             \
  struct x2 {                                                                              \
    __hip_fp8x2_storage_t __x;                                                                   \
    x2() = default;                                                                        \
    HZ_FP8_FN x2(float2 f)                                                                 \
        : __x((__hip_fp8x2_storage_t)(name(f.x).__x | (name(f.y).__x << 8))) {}                  \
    HZ_FP8_FN operator float2() const {                                                          \
      return float2{hz_fp8_to_float(__x & 0xff, man, bias, fnuz), hz_fp8_to_float(__x >> 8, man, bias, fnuz)}; \
    }                                                                                            \
  };                                                                                             \
  struct x4 {                                                                              \
    __hip_fp8x4_storage_t __x;                                                                   \
    x4() = default;                                                                        \
    HZ_FP8_FN x4(float4 f)                                                                 \
        : __x(name(f.x).__x | (name(f.y).__x << 8) | (name(f.z).__x << 16) | ((unsigned)name(f.w).__x << 24)) {} \
  };
HZ_FP8_TYPE(__hip_fp8_e4m3, __hip_fp8x2_e4m3, __hip_fp8x4_e4m3, 3, 7, false, 448.0f)
HZ_FP8_TYPE(__hip_fp8_e5m2, __hip_fp8x2_e5m2, __hip_fp8x4_e5m2, 2, 15, false, 57344.0f)
HZ_FP8_TYPE(__hip_fp8_e4m3_fnuz, __hip_fp8x2_e4m3_fnuz, __hip_fp8x4_e4m3_fnuz, 3, 8, true, 240.0f)
HZ_FP8_TYPE(__hip_fp8_e5m2_fnuz, __hip_fp8x2_e5m2_fnuz, __hip_fp8x4_e5m2_fnuz, 2, 16, true, 57344.0f)
#undef HZ_FP8_TYPE
#undef HZ_FP8_FN
#endif
