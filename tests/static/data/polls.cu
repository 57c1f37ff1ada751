// Flag polls for the SASS checks (nvcc -cubin -arch=sm_90a, nvdisasm). Each kernel is
// named for what the checks must say about it.
__global__ void spin_plain_flag_hangs(int* flag, int* data, int* out) {
  while (*flag == 0) {  // nvcc loads the flag once and spins on a register
  }
  out[threadIdx.x] = data[threadIdx.x];
}
__global__ void spin_volatile_no_acquire(int* flag, int* data, int* out) {
  while (*(volatile int*)flag == 0) {
  }
  out[threadIdx.x] = data[threadIdx.x];  // may read stale L1 lines
}
__global__ void spin_acquire_ok(int* flag, int* data, int* out) {
  int v;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  } while (v == 0);
  out[threadIdx.x] = data[threadIdx.x];
}
__global__ void spin_volatile_then_fence_ok(int* flag, int* data, int* out) {
  while (*(volatile int*)flag == 0) {
  }
  __threadfence();
  out[threadIdx.x] = data[threadIdx.x];
}
__global__ void counted_loop_is_not_a_spin(int* data, int n) {
  int acc = 0;
  for (int i = 0; i < n; ++i) acc = acc * 3 + i;  // no load, but its exit test changes
  data[threadIdx.x] = acc;
}
__global__ void mbarrier_try_wait_loop_ok(int* out, int phase) {
  // Hopper's mbarrier wait: SYNCS.PHASECHK.TRANS64.TRYWAIT reads the barrier in shared
  // memory and sets the exit predicate itself - a memory poll, not a load-free spin.
  __shared__ unsigned long long bar;
  unsigned a = (unsigned)__cvta_generic_to_shared(&bar);
  if (threadIdx.x == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a));
  __syncthreads();
  unsigned done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(a), "r"(phase) : "memory");
  }
  out[threadIdx.x] = 1;
}
