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
// The MI355 megakernel PR's chunk arrival: every thread stores its partial, the block meets
// at a barrier, then one thread bumps the arrival counter with a relaxed atomic. The barrier
// orders execution, not memory: the counter can be seen before the partials.
#define SYNC_BLOCK()                                  \
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); \
  __builtin_amdgcn_s_barrier();                        \
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup")
__global__ void arrival_after_barrier_flagged(float* part, int* counter) {
  part[TID] = 1.0f;
  SYNC_BLOCK();
  if (TID == 0) __hip_atomic_fetch_add(counter, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// the fix: an agent-scope release before the barrier
__global__ void arrival_after_fence_ok(float* part, int* counter) {
  part[TID] = 1.0f;
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
  SYNC_BLOCK();
  if (TID == 0) __hip_atomic_fetch_add(counter, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// a statistics counter after this thread's own store, no barrier: not a release
__global__ void histogram_counter_ok(const int* in, float* out, int* hist) {
  out[TID] = 2.0f;
  __hip_atomic_fetch_add(hist + (in[TID] & 15), 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// a reduction over data: the exit tests a counter, not a value another agent writes
__global__ void reduction_loop_is_not_a_poll_ok(const float* data, float* out, int n) {
  float acc = 0.0f;
  for (int i = TID; i < n; i += 64) acc += __builtin_nontemporal_load(data + i);
  out[TID] = acc;
}
// a search over data (a different address each trip) is not a poll
__global__ void search_loop_is_not_a_poll_ok(const int* data, int* out) {
  int i = TID;
  while (__hip_atomic_load(data + i, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) != 0) i += 64;
  out[TID] = data[i + 1];
}
