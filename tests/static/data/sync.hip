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
// aiter's all-reduce start_sync shape: each rank stores the value it then waits for into every
// peer's slot (relaxed, system scope), waits until its own slots reach it, then reads every
// rank's input - written before the launch: the barrier publishes nothing the kernel wrote
#define BID __builtin_amdgcn_workgroup_id_x()
struct Signal { unsigned start[64][8]; unsigned end[64][8]; unsigned flag[64]; };
__global__ void start_barrier_ok(Signal** peers, Signal* self, const float* const* in, float* out, int rank) {
  unsigned v = self->flag[BID] + 1;
  if (TID < 8) {
    __hip_atomic_store(&peers[TID]->start[BID][rank], v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    while (__hip_atomic_load(&self->start[BID][TID], __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) < v) {
    }
  }
  __builtin_amdgcn_s_barrier();
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += in[i][TID];
  out[TID] = s;
}
// the same barrier after a store of data: now it publishes that store, and the reads need an acquire
__global__ void start_barrier_after_a_store_flagged(Signal** peers, Signal* self, const float* const* in,
                                                     float* out, float* mine, int rank) {
  mine[TID] = 1.f;
  unsigned v = self->flag[BID] + 1;
  if (TID < 8) {
    __hip_atomic_store(&peers[TID]->start[BID][rank], v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    while (__hip_atomic_load(&self->start[BID][TID], __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) < v) {
    }
  }
  __builtin_amdgcn_s_barrier();
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += in[i][TID];
  out[TID] = s;
}
// aiter's end_sync<final_sync = true>: the output is stored, then a relaxed arrive-and-wait
// after which nothing is read: the barrier publishes nothing another rank reads (no release)
__global__ void final_barrier_ok(Signal** peers, Signal* self, float* out, int rank) {
  out[TID] = 2.f;
  __builtin_amdgcn_s_barrier();
  unsigned v = self->flag[BID] + 1;
  if (TID < 8) {
    __hip_atomic_store(&peers[TID]->end[BID][rank], v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    while (__hip_atomic_load(&self->end[BID][TID], __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) < v) {
    }
  }
}
// the same barrier with a read of a peer's data after its wait: a release of the output is needed
__global__ void middle_barrier_flagged(Signal** peers, Signal* self, float* out, const float* const* peer_out,
                                       int rank) {
  out[TID] = 2.f;
  __builtin_amdgcn_s_barrier();
  unsigned v = self->flag[BID] + 1;
  if (TID < 8) {
    __hip_atomic_store(&peers[TID]->end[BID][rank], v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    while (__hip_atomic_load(&self->end[BID][TID], __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) < v) {
    }
  }
  __builtin_amdgcn_s_barrier();
  out[TID + 64] = peer_out[(rank + 1) & 7][TID];
}
// a thread's private array (scratch memory, indexed at run time) is nobody's published data:
// neither a store to it before a write-through flag nor a read of it after a poll
__global__ void private_array_around_flags_ok(const int* in, int* flag, int* out, int n) {
  int buf[64];
  for (int k = 0; k < 64; ++k) buf[k] = in[k * n + TID];
  __hip_atomic_store(flag, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  while (__hip_atomic_load(flag + 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) == 0) {
  }
  out[TID] = buf[(TID * 7 + n) & 63];
}
// a volatile shared-memory reduction through a plain pointer (aiter's smemReduceSum) compiles
// to flat stores with sc0 sc1 into LDS: not flags another agent polls, so the global store
// before them needs no write-back
__global__ void volatile_lds_through_a_pointer_ok(float* out, const float* in) {
  __attribute__((shared)) float sm[128];
  out[TID] = in[TID];
  sm[TID] = in[TID + 64];
  __builtin_amdgcn_s_barrier();
  volatile float* v = sm;
  if (TID < 32) {
    v[TID] += v[TID + 32];
    v[TID] += v[TID + 16];
  }
  __builtin_amdgcn_s_barrier();
  out[TID + 128] = sm[0];
}
