// Polls for the precision of the SASS poll checks (nvcc -cubin -arch=sm_90a). Each kernel is
// named for what the checks must say about it: `_flagged` kernels read data a flag published
// with no acquire after the poll; `_ok` kernels must give no error.
__device__ __forceinline__ int ld_volatile(const int* p) { return *(const volatile int*)p; }

// The flag's address comes from a pointer table: the table load is not the poll, the load of
// the flag through it is; the plain read of the published data after it has no acquire.
__global__ void pointer_table_poll_flagged(int** flags, const int* data, int* out, int peer) {
  while (ld_volatile(flags[peer]) == 0) {
  }
  out[threadIdx.x] = data[threadIdx.x];
}
// The exit is decided by a warp vote over the polled value (__all_sync).
__global__ void all_sync_poll_flagged(const int* flag, const int* data, int* out) {
  while (!__all_sync(0xffffffffu, ld_volatile(flag + (threadIdx.x & 7)) != 0)) {
  }
  out[threadIdx.x] = data[threadIdx.x];
}
// A block-scope fence orders nothing another block (or GPU) wrote: no acquire.
__global__ void block_fence_after_poll_flagged(const int* flag, const int* data, int* out) {
  while (ld_volatile(flag) == 0) {
  }
  __threadfence_block();
  out[threadIdx.x] = data[threadIdx.x];
}
// Many weak reads after one poll: one finding.
__global__ void many_reads_one_finding_flagged(const int* flag, const int* a, const int* b,
                                               const int* c, int* out) {
  while (ld_volatile(flag) == 0) {
  }
  int t = threadIdx.x;
  out[t] = a[t] + b[t] * 3 + c[t] * 5 + a[t + 64] + b[t + 64];
}
// A gpu-scope fence after the poll is the acquire.
__global__ void gpu_fence_after_poll_ok(const int* flag, const int* data, int* out) {
  while (ld_volatile(flag) == 0) {
  }
  __threadfence();
  out[threadIdx.x] = data[threadIdx.x];
}
// A credit ("free slot") wait: the producer waits for the consumer's head, then copies its
// own read-only input (__ldg: ld.global.nc) into the ring and publishes it. Nothing the
// polled flag's writer published is read.
__global__ void credit_poll_then_own_input_ok(const int* head, const int* __restrict__ in,
                                              int* ring, int* tail, int mine) {
  while (ld_volatile(head) + 8 <= mine) {
  }
  ring[threadIdx.x] = __ldg(in + threadIdx.x) * 2;
  __threadfence();
  if (threadIdx.x == 0) atomicExch(tail, mine + 1);
}
// A search over data (a different address each trip) is not a poll.
__global__ void search_loop_is_not_a_poll_ok(const int* data, int* out) {
  int i = threadIdx.x;
  while (data[i] != 0) i += 32;
  out[threadIdx.x] = data[i + 1] + i;
}
// A loop over a local array (local-memory loads) is not a poll.
__global__ void local_memory_loop_is_not_a_poll_ok(const int* in, int* out, int n) {
  int buf[64];
  for (int k = 0; k < 64; ++k) buf[k] = in[k * blockDim.x + threadIdx.x];
  int j = threadIdx.x & 63;
  while (buf[j] > 0 && j < 63) j = (j + buf[j]) & 63;
  out[threadIdx.x] = in[j];
}
