// Just enough of the HIP device environment to compile hz_tripwire.h with clang -nogpuinc
// (no ROCm installed here): attribute spellings, thread/block ids from the AMDGCN builtins.
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __forceinline__ inline __attribute__((always_inline))
struct hz_shim_dim3 { unsigned x, y, z; };
__device__ inline hz_shim_dim3 hz_shim_tid() { return {__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(), __builtin_amdgcn_workitem_id_z()}; }
__device__ inline hz_shim_dim3 hz_shim_bid() { return {__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), __builtin_amdgcn_workgroup_id_z()}; }
__device__ inline hz_shim_dim3 hz_shim_bdim() { return {64, 1, 1}; }
#define threadIdx (hz_shim_tid())
#define blockIdx (hz_shim_bid())
#define blockDim (hz_shim_bdim())
#define warpSize 64
__device__ inline void __syncthreads() { __builtin_amdgcn_s_barrier(); }
