// Release/acquire shapes for the AMDGCN (d) checks: one kernel per pattern, each named for
// what the check must say about it. gfx942, built by clang-19 with -nogpuinc.
#define __global__ __attribute__((global))
#define TID __builtin_amdgcn_workitem_id_x()

// release at system scope, write-through flag: buffer_wbl2 sc0 sc1 + s_waitcnt before it
__global__ void release_system_ok(int* data, int* flag) {
  data[TID] = 1;
  __hip_atomic_store(flag, 1, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
// the MI355 PR's TopK routing flag: data, a workgroup barrier only, then a write-through flag
__global__ void release_barrier_only(int* data, int* flag) {
  data[TID] = 1;
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
  __hip_atomic_store(flag, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
// acquire load at agent scope: buffer_inv sc1 inside the poll loop
__global__ void acquire_agent_ok(int* data, int* flag, int* out) {
  while (__hip_atomic_load(flag, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT) == 0) {
  }
  out[0] = data[TID];
}
// relaxed poll, then a plain load of the published data: no acquire
__global__ void poll_relaxed_no_acquire(int* data, int* flag, int* out) {
  while (__hip_atomic_load(flag, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) == 0) {
  }
  out[0] = data[TID];
}
// relaxed poll then an explicit agent-scope acquire fence
__global__ void poll_then_fence_ok(int* data, int* flag, int* out) {
  while (__hip_atomic_load(flag, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) == 0) {
  }
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent");
  out[0] = data[TID];
}
