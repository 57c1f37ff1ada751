// compat.h -- keeps the family sources HIP-portable.
//
// Family sources are written in CUDA spelling (cudaMalloc, __syncthreads, ...). Built with
// hipcc (or clang -x hip) the runtime names below are mapped to their HIP twins; built with
// nvcc this header only pulls in the CUDA runtime. Memory-ordering and async-copy helpers
// that have no common spelling (acquire loads, cp.async) live here too, so that a family
// never writes `asm` for one vendor without a fallback for the other.
//
// HZ_HIP is 1 for a HIP build, 0 for CUDA. HZ_HAVE_CP_ASYNC says whether the
// `cp.async` (sm_80+) path is real; where it is not, hz_cp_async_* degrade to plain
// synchronous copies and families answer the cp_async copy kind as unsupported (hz::Unsupported).
#pragma once

#if defined(HZ_STATIC_ONLY) && defined(__HIP__)
// Device-only compile for the static checks (clang -x hip --cuda-device-only -nogpuinc): no
// HIP headers exist there, so the few device names family code uses are spelled out here.
#define HZ_HIP 1
#define HZ_HIP_STATIC 1
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
typedef float float4 __attribute__((ext_vector_type(4)));
__device__ __forceinline__ unsigned hz_static_tid() { return __builtin_amdgcn_workitem_id_x(); }
__device__ __forceinline__ unsigned hz_static_bid() { return __builtin_amdgcn_workgroup_id_x(); }
__device__ __forceinline__ void __threadfence() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }
__device__ __forceinline__ void __syncthreads() {  // as HIP spells it: fences around s_barrier
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
__device__ __forceinline__ long long clock64() { return (long long)__builtin_amdgcn_s_memtime(); }
#define HZ_WARP_SIZE 64
#elif defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define HZ_HIP 1
#include <hip/hip_runtime.h>

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaGetLastError hipGetLastError
#define cudaPeekAtLastError hipPeekAtLastError
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStream_t hipStream_t
#define cudaStreamCreate hipStreamCreate
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventQuery hipEventQuery
#define cudaErrorNotReady hipErrorNotReady
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define HZ_WARP_SIZE 64
#else
#define HZ_HIP 0
#include <cuda_runtime.h>
#define HZ_WARP_SIZE 32
#endif

#if !HZ_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define HZ_HAVE_CP_ASYNC 1
#else
#define HZ_HAVE_CP_ASYNC 0
#endif

// Host-side: is the cp.async path compiled in for the device code of this binary?
#if !HZ_HIP
#define HZ_HOST_HAS_CP_ASYNC 1
#else
#define HZ_HOST_HAS_CP_ASYNC 0
#endif

#include <stdint.h>

// ---------------------------------------------------------------------------------------
// Memory-ordering primitives (device). Scope "gpu" = NVIDIA .gpu = HIP agent scope.
// ---------------------------------------------------------------------------------------

// A relaxed 32-bit load that the compiler may neither cache in a register nor hoist:
// volatile on both vendors (ld.volatile on NVIDIA, which bypasses nothing but is never
// merged or moved across other volatile accesses).
__device__ __forceinline__ uint32_t hz_ld_volatile(const uint32_t* p) {
  return *(const volatile uint32_t*)p;
}
__device__ __forceinline__ void hz_st_volatile(uint32_t* p, uint32_t v) { *(volatile uint32_t*)p = v; }

// Acquire load at gpu scope: later loads of this thread cannot observe memory older than
// what the releasing writer published (on NVIDIA this also invalidates stale L1 lines).
__device__ __forceinline__ uint32_t hz_ld_acquire_gpu(const uint32_t* p) {
#if HZ_HIP
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
#else
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}

// Release store at gpu scope: earlier memory operations of this thread are visible before
// the stored value is.
__device__ __forceinline__ void hz_st_release_gpu(uint32_t* p, uint32_t v) {
#if HZ_HIP
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
#else
  asm volatile("st.release.gpu.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
#endif
}

// A full fence at gpu scope (both vendors spell it __threadfence).
__device__ __forceinline__ void hz_fence_gpu() { __threadfence(); }

// Busy-wait about `cycles` SM clocks (portable warp jitter; clock64 exists on both).
__device__ __forceinline__ void hz_spin_cycles(long long cycles) {
  if (cycles <= 0) return;
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// How many clocks warp `warp` of its block lags under a warp skew of `units`: warp * units * 64
// (the families' skew parameters count 64-clock units: warp 3 at 16 is ~1.5 us late). Timing only.
// A macro, not a function: the expression is then the one each family wrote before, operation for
// operation (an inline function's long long parameter made nvcc order the products differently).
#define HZ_WARP_SKEW_CYCLES(warp, units) ((long long)(warp) * (units) * 64)

// ---------------------------------------------------------------------------------------
// Async global->shared copies. On sm_80+ CUDA these are cp.async; elsewhere a synchronous
// 16-byte copy, and commit/wait are no-ops (the data is in shared memory at return).
// ---------------------------------------------------------------------------------------
__device__ __forceinline__ void hz_cp_async_16(void* smem_dst, const void* gmem_src) {
#if HZ_HAVE_CP_ASYNC
  unsigned s = (unsigned)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(s), "l"(gmem_src) : "memory");
#else
  *(float4*)smem_dst = *(const float4*)gmem_src;
#endif
}

__device__ __forceinline__ void hz_cp_async_commit() {
#if HZ_HAVE_CP_ASYNC
  asm volatile("cp.async.commit_group;" : : : "memory");
#endif
}

// cp.async.wait_group takes an immediate: dispatch a run-time depth to the constant forms.
// Depths above 7 are clamped (a family never keeps more than 4 groups in flight).
__device__ __forceinline__ void hz_cp_async_wait(int pending) {
#if HZ_HAVE_CP_ASYNC
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;" : : : "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" : : : "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" : : : "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" : : : "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" : : : "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" : : : "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" : : : "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" : : : "memory"); break;
  }
#else
  (void)pending;
#endif
}
