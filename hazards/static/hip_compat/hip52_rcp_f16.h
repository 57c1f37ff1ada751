// Force-included by hazards.static.userbuild when a clang newer than the installed HIP
// headers compiles HIP with them: HIP 5.2's hip_fp16.h calls __llvm_amdgcn_rcp_f16 and
// __llvm_amdgcn_rcp_2f16, which it expects from clang's HIP runtime wrapper; clang 22's
// wrapper no longer declares them. The reciprocal of a half and of a half pair, written
// as a division (what clang 19's wrapper did for them).
#pragma once
#if defined(__HIP__)
__attribute__((device)) inline _Float16 __llvm_amdgcn_rcp_f16(_Float16 x) { return ((_Float16)1.0f) / x; }
__attribute__((device)) inline _Float16 __attribute__((ext_vector_type(2)))
__llvm_amdgcn_rcp_2f16(_Float16 __attribute__((ext_vector_type(2))) x) {
  return ((_Float16 __attribute__((ext_vector_type(2))))1.0f) / x;
}
#endif
