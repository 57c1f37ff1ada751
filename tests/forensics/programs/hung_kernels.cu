// Kernels that never finish, built WITHOUT any instrumentation: the hang-forensics test
// subjects (the only way to see where they hang is to attach a debugger). Every block has
// two warps: thread 0 waits on something that never comes, the other threads wait for it
// at __syncthreads, so each hang shows two stuck locations with two different wait kinds.
//   spin     thread 0 spins on a volatile flag nobody sets (a spin on a load)
//   gridbar  a grid barrier (atomic arrive, acquire-load poll with __nanosleep backoff)
//            launched one block past co-residency: the resident blocks wait for a block
//            that can never become resident (1 block per SM, forced by shared memory)
//   mbar     thread 0 waits on a shared-memory mbarrier that expects 2 arrivals and gets
//            1 (mbarrier.try_wait loop, sm_90)
//   hoisted  thread 0 spins on a NON-volatile flag: the compiler hoists the load, the
//            loop is a branch to itself with no load in it
// Built as a program (`hung_kernels MODE`: prints "HZ_HANG launched ..." then waits in
// cudaDeviceSynchronize) or, with -DHZ_HANG_LIBRARY, as a shared library whose
// hz_hang_launch(mode, stream) a Python program calls through ctypes.
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <cuda_runtime.h>

__global__ void spin_on_flag(volatile int* flag) {
  if (threadIdx.x == 0) {
    while (*flag == 0) {
    }
  }
  __syncthreads();
}

__device__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void grid_barrier(unsigned* arrived, unsigned expected) {
  extern __shared__ char pad[];  // only there to allow one block per SM
  if (threadIdx.x == 0) {
    pad[0] = 1;
    atomicAdd(arrived, 1u);
    while (load_acquire(arrived) < expected) {
      __nanosleep(256);
    }
  }
  __syncthreads();
}

__global__ void mbarrier_short(int unused) {
  __shared__ uint64_t bar;
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" :: "r"(addr), "r"(2) : "memory");
    uint64_t state = 0;
    asm volatile("mbarrier.arrive.shared.b64 %0, [%1];" : "=l"(state) : "r"(addr) : "memory");
    asm volatile("" :: "l"(state));
    unsigned done = 0;
    while (!done) {
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(addr), "r"(0) : "memory");
    }
  }
  __syncthreads();
}

__global__ void spin_hoisted(int* flag) {
  if (threadIdx.x == 0) {
    while (*flag == 0) {
    }
  }
  __syncthreads();
}

constexpr int kThreads = 64;

extern "C" int hz_hang_launch(const char* mode, void* stream_ptr, int* grid_out) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  void* flag = nullptr;
  if (cudaMalloc(&flag, 64) != cudaSuccess || cudaMemset(flag, 0, 64) != cudaSuccess) return 1;
  int grid = sms;
  if (!strcmp(mode, "spin")) {
    spin_on_flag<<<grid, kThreads, 0, stream>>>(static_cast<volatile int*>(flag));
  } else if (!strcmp(mode, "gridbar")) {
    int smem = 0, per_sm = 0;
    cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaFuncSetAttribute(grid_barrier, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_barrier, kThreads, smem);
    grid = per_sm * sms + 1;  // one block past co-residency
    grid_barrier<<<grid, kThreads, smem, stream>>>(static_cast<unsigned*>(flag), grid);
  } else if (!strcmp(mode, "mbar")) {
    mbarrier_short<<<grid, kThreads, 0, stream>>>(0);
  } else if (!strcmp(mode, "hoisted")) {
    spin_hoisted<<<grid, kThreads, 0, stream>>>(static_cast<int*>(flag));
  } else {
    return 2;
  }
  if (grid_out) *grid_out = grid;
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

#ifndef HZ_HANG_LIBRARY
int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "spin";
  int grid = 0;
  int rc = hz_hang_launch(mode, nullptr, &grid);
  if (rc == 2) {
    fprintf(stderr, "usage: %s spin|gridbar|mbar|hoisted\n", argv[0]);
    return 2;
  }
  if (rc) {
    fprintf(stderr, "launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 3;
  }
  printf("HZ_HANG launched mode=%s grid=%d block=%d\n", mode, grid, kThreads);
  fflush(stdout);
  cudaError_t err = cudaDeviceSynchronize();
  printf("HZ_HANG finished (unexpected): %s\n", cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 3;
}
#endif
