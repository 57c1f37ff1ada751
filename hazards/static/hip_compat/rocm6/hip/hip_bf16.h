// gpu-hazards' own minimal stand-in for ROCm 6's <hip/hip_bf16.h>, for compiling HIP sources
// written for ROCm 6 on a machine with an older HIP (Debian's 5.2) in the static checks'
// compiled mode. Written for this project from the names such sources use: the 16-bit
// brain-float scalar and pair types and their conversions, with round-to-nearest-even
// (what a kernel's synchronisation and asm blocks are judged on does not depend on them,
// but register allocation around them may: a build with this header is an approximation
// of a ROCm 6 build, and the results pages say so). Only what is declared here exists: a
// source needing more fails to compile, and compiled mode reports that, never a pass.
#pragma once
#if __has_include_next(<hip/hip_bf16.h>)  // a HIP that has it (ROCm 6 and later): the real one
#include_next <hip/hip_bf16.h>
#else
#include <hip/hip_runtime.h>
#include <stdint.h>

#define HZ_BF16_FN __attribute__((host, device)) inline

struct __hip_bfloat16_raw { unsigned short x; };
struct __hip_bfloat162_raw { unsigned short x, y; };

HZ_BF16_FN unsigned short hz_bf16_bits_from_float(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return (unsigned short)((u >> 16) | 0x40u);  // a NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);               // round to nearest, ties to even
  return (unsigned short)(u >> 16);
}
HZ_BF16_FN float hz_bf16_bits_to_float(unsigned short b) {
  return __builtin_bit_cast(float, (uint32_t)b << 16);
}

struct __hip_bfloat16 {
  unsigned short data;
  __hip_bfloat16() = default;
  HZ_BF16_FN __hip_bfloat16(float f) : data(hz_bf16_bits_from_float(f)) {}
  HZ_BF16_FN __hip_bfloat16(double f) : data(hz_bf16_bits_from_float((float)f)) {}
  HZ_BF16_FN __hip_bfloat16(int i) : data(hz_bf16_bits_from_float((float)i)) {}
  HZ_BF16_FN __hip_bfloat16(const __hip_bfloat16_raw& r) : data(r.x) {}
  HZ_BF16_FN operator float() const { return hz_bf16_bits_to_float(data); }
  HZ_BF16_FN operator __hip_bfloat16_raw() const { return __hip_bfloat16_raw{data}; }
  HZ_BF16_FN __hip_bfloat16& operator=(float f) { data = hz_bf16_bits_from_float(f); return *this; }
  HZ_BF16_FN __hip_bfloat16& operator=(const __hip_bfloat16_raw& r) { data = r.x; return *this; }
  HZ_BF16_FN __hip_bfloat16& operator+=(const __hip_bfloat16& o) { return *this = float(*this) + float(o); }
  HZ_BF16_FN __hip_bfloat16& operator-=(const __hip_bfloat16& o) { return *this = float(*this) - float(o); }
  HZ_BF16_FN __hip_bfloat16& operator*=(const __hip_bfloat16& o) { return *this = float(*this) * float(o); }
  HZ_BF16_FN __hip_bfloat16& operator/=(const __hip_bfloat16& o) { return *this = float(*this) / float(o); }
};

struct __hip_bfloat162 {
  __hip_bfloat16 x, y;
  __hip_bfloat162() = default;
  HZ_BF16_FN __hip_bfloat162(__hip_bfloat16 a, __hip_bfloat16 b) : x(a), y(b) {}
  HZ_BF16_FN __hip_bfloat162(const __hip_bfloat162_raw& r) : x(__hip_bfloat16_raw{r.x}), y(__hip_bfloat16_raw{r.y}) {}
  HZ_BF16_FN operator __hip_bfloat162_raw() const { return __hip_bfloat162_raw{x.data, y.data}; }
};

#define HZ_BF16_BINARY(op)                                                                     \
  HZ_BF16_FN __hip_bfloat16 operator op(const __hip_bfloat16& a, const __hip_bfloat16& b) {   \
    return __hip_bfloat16(float(a) op float(b));                                               \
  }                                                                                            \
  HZ_BF16_FN __hip_bfloat162 operator op(const __hip_bfloat162& a, const __hip_bfloat162& b) { \
    return __hip_bfloat162(a.x op b.x, a.y op b.y);                                            \
  }
HZ_BF16_BINARY(+)
HZ_BF16_BINARY(-)
HZ_BF16_BINARY(*)
HZ_BF16_BINARY(/)
#undef HZ_BF16_BINARY
HZ_BF16_FN __hip_bfloat16 operator-(const __hip_bfloat16& a) {
  __hip_bfloat16 r; r.data = (unsigned short)(a.data ^ 0x8000u); return r;
}
#define HZ_BF16_COMPARE(op) \
  HZ_BF16_FN bool operator op(const __hip_bfloat16& a, const __hip_bfloat16& b) { return float(a) op float(b); }
HZ_BF16_COMPARE(==)
HZ_BF16_COMPARE(!=)
HZ_BF16_COMPARE(<)
HZ_BF16_COMPARE(<=)
HZ_BF16_COMPARE(>)
HZ_BF16_COMPARE(>=)
#undef HZ_BF16_COMPARE

HZ_BF16_FN __hip_bfloat16 __float2bfloat16(float f) { return __hip_bfloat16(f); }
HZ_BF16_FN __hip_bfloat16 __float2bfloat16_rn(float f) { return __hip_bfloat16(f); }
HZ_BF16_FN float __bfloat162float(__hip_bfloat16 a) { return float(a); }
HZ_BF16_FN __hip_bfloat16 __ushort_as_bfloat16(unsigned short b) { __hip_bfloat16 r; r.data = b; return r; }
HZ_BF16_FN unsigned short __bfloat16_as_ushort(__hip_bfloat16 a) { return a.data; }
HZ_BF16_FN __hip_bfloat162 __float2bfloat162_rn(float f) { return __hip_bfloat162(f, f); }
HZ_BF16_FN __hip_bfloat162 __floats2bfloat162_rn(float a, float b) { return __hip_bfloat162(a, b); }
HZ_BF16_FN __hip_bfloat162 __float22bfloat162_rn(float2 f) { return __hip_bfloat162(f.x, f.y); }
HZ_BF16_FN float2 __bfloat1622float2(__hip_bfloat162 a) { return float2{float(a.x), float(a.y)}; }
HZ_BF16_FN __hip_bfloat162 __bfloat162bfloat162(__hip_bfloat16 a) { return __hip_bfloat162(a, a); }
HZ_BF16_FN __hip_bfloat162 __halves2bfloat162(__hip_bfloat16 a, __hip_bfloat16 b) { return __hip_bfloat162(a, b); }
HZ_BF16_FN __hip_bfloat16 __low2bfloat16(__hip_bfloat162 a) { return a.x; }
HZ_BF16_FN __hip_bfloat16 __high2bfloat16(__hip_bfloat162 a) { return a.y; }
HZ_BF16_FN float __low2float(__hip_bfloat162 a) { return float(a.x); }
HZ_BF16_FN float __high2float(__hip_bfloat162 a) { return float(a.y); }
HZ_BF16_FN __hip_bfloat16 __hadd(__hip_bfloat16 a, __hip_bfloat16 b) { return a + b; }
HZ_BF16_FN __hip_bfloat16 __hsub(__hip_bfloat16 a, __hip_bfloat16 b) { return a - b; }
HZ_BF16_FN __hip_bfloat16 __hmul(__hip_bfloat16 a, __hip_bfloat16 b) { return a * b; }
HZ_BF16_FN __hip_bfloat16 __hdiv(__hip_bfloat16 a, __hip_bfloat16 b) { return a / b; }
HZ_BF16_FN __hip_bfloat16 __hfma(__hip_bfloat16 a, __hip_bfloat16 b, __hip_bfloat16 c) {
  return __hip_bfloat16(float(a) * float(b) + float(c));
}
HZ_BF16_FN __hip_bfloat162 __hadd2(__hip_bfloat162 a, __hip_bfloat162 b) { return a + b; }
HZ_BF16_FN __hip_bfloat162 __hsub2(__hip_bfloat162 a, __hip_bfloat162 b) { return a - b; }
HZ_BF16_FN __hip_bfloat162 __hmul2(__hip_bfloat162 a, __hip_bfloat162 b) { return a * b; }
HZ_BF16_FN __hip_bfloat162 __hfma2(__hip_bfloat162 a, __hip_bfloat162 b, __hip_bfloat162 c) {
  return __hip_bfloat162(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}
HZ_BF16_FN __hip_bfloat16 __hmax(__hip_bfloat16 a, __hip_bfloat16 b) { return float(a) < float(b) ? b : a; }
HZ_BF16_FN __hip_bfloat16 __hmin(__hip_bfloat16 a, __hip_bfloat16 b) { return float(b) < float(a) ? b : a; }
HZ_BF16_FN __hip_bfloat162 __hmax2(__hip_bfloat162 a, __hip_bfloat162 b) { return __hip_bfloat162(__hmax(a.x, b.x), __hmax(a.y, b.y)); }
HZ_BF16_FN __hip_bfloat162 __hmin2(__hip_bfloat162 a, __hip_bfloat162 b) { return __hip_bfloat162(__hmin(a.x, b.x), __hmin(a.y, b.y)); }
HZ_BF16_FN __hip_bfloat16 hrcp(__hip_bfloat16 a) { return __hip_bfloat16(1.0f / float(a)); }
HZ_BF16_FN __hip_bfloat162 h2rcp(__hip_bfloat162 a) { return __hip_bfloat162(hrcp(a.x), hrcp(a.y)); }
HZ_BF16_FN __hip_bfloat16 __habs(__hip_bfloat16 a) { __hip_bfloat16 r; r.data = (unsigned short)(a.data & 0x7fffu); return r; }
HZ_BF16_FN bool __hgt(__hip_bfloat16 a, __hip_bfloat16 b) { return a > b; }
HZ_BF16_FN bool __hlt(__hip_bfloat16 a, __hip_bfloat16 b) { return a < b; }
HZ_BF16_FN bool __hge(__hip_bfloat16 a, __hip_bfloat16 b) { return a >= b; }
HZ_BF16_FN bool __hle(__hip_bfloat16 a, __hip_bfloat16 b) { return a <= b; }
HZ_BF16_FN bool __heq(__hip_bfloat16 a, __hip_bfloat16 b) { return a == b; }

typedef __hip_bfloat16 hip_bf16;
typedef __hip_bfloat162 hip_bf162;
#undef HZ_BF16_FN
#endif
