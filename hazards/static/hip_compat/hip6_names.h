// gpu-hazards' own declarations of HIP 6 host-API names that Debian's HIP 5.2 lacks, force-
// included (with rocm6/ on the include path) to compile ROCm 6 sources in the static checks'
// compiled mode. Only the device code is judged: these names appear in host code, so a
// declaration (or the HIP 5.2 name of the same enumerator's kind) is all they need.
#pragma once
#include <hip/hip_runtime.h>
#include <unordered_map>  // ROCm 6's HIP headers bring these in; sources rely on that
#include <vector>
#if !defined(HIP_VERSION_MAJOR) || HIP_VERSION_MAJOR < 6
#define hipDeviceAttributePciChipId hipDeviceAttributePciBusId
#define hipDeviceMallocUncached hipDeviceMallocFinegrained
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR HIP_POINTER_ATTRIBUTE_RANGE_START_ADDR
hipError_t hipGetFuncBySymbol(hipFunction_t* function, const void* symbol);
// a wave's lanes meet and see each other's memory (HIP 6's __syncwarp; the mask is not needed
// on AMD, where a wave executes in lockstep)
__attribute__((device)) inline void __syncwarp(unsigned long long mask = ~0ull) {
  (void)mask;
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
#endif
