// earlyclobber.hip -- family `earlyclobber` (AMD, static): a multi-load inline-asm block
// whose outputs are not early-clobber.
//
// Hazard seeded (the MI355 megakernel PR, "Root cause of the intermittent
// long-sequence hang"): four `global_load_dwordx4` in ONE asm block with plain "=v"
// outputs. The compiler treats every input as read at the start of the block and every
// output as written at its end, so it may give an output the registers of an input it
// considers dead afterwards. Load 1's destination then covers load 2's address, and loads
// 2..4 address memory with the data load 1 returned: a nil-address fault, or a wave parked
// on `s_waitcnt vmcnt(0)` forever (a deadlock through every barrier downstream).
//
// Why the fixed variant is correct: "=&v" (early-clobber) tells the allocator the outputs
// are written before all inputs are consumed, so no output may share a register with any
// input; the addresses then live in registers disjoint from every destination.
// The reference issues one load per asm statement, which cannot alias at all.
//
// Variants are compile-time parameters (never copies):
//   HZ_EARLY_CLOBBER 0|1  outputs "=v" or "=&v"
//   HZ_SPLIT         0|1  one asm statement per load (reference)
//   HZ_LOADS         2..4 loads in the block
//   HZ_SHARED_BASE   0|1  0: every load gets its own address input; 1: one base address
//                         input and `offset:` immediates (load k reads the base again)
// Built by `hazards.static` with clang-19 -x hip --offload-arch=gfx942 -nogpulib -nogpuinc
// --cuda-device-only -O3 -S (HZ_STATIC_ONLY: the two attribute defines below replace the
// HIP headers). NVIDIA: PTX operands are virtual registers and ptxas allocates afterwards,
// so this overlap cannot happen there; the family is AMD-only.
#if defined(HZ_STATIC_ONLY)
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#else
#include <hip/hip_runtime.h>
#endif

#ifndef HZ_EARLY_CLOBBER
#define HZ_EARLY_CLOBBER 0
#endif
#ifndef HZ_SPLIT
#define HZ_SPLIT 0
#endif
#ifndef HZ_LOADS
#define HZ_LOADS 4
#endif
#ifndef HZ_SHARED_BASE
#define HZ_SHARED_BASE 0
#endif

#if HZ_EARLY_CLOBBER
#define HZ_OUT "=&v"
#else
#define HZ_OUT "=v"
#endif

typedef float hz_f4 __attribute__((ext_vector_type(4)));

#define HZ_LOAD_NT "global_load_dwordx4 "
// HZ_SRC(operand, offset): the address part of load k -- its own input %operand, or the
// shared base %4 plus an immediate offset.
#if HZ_SHARED_BASE
#define HZ_SRC(opnd, off) "%4, off offset:" #off " sc0 sc1 nt\n\t"
#else
#define HZ_SRC(opnd, off) "%" #opnd ", off sc0 sc1 nt\n\t"
#endif

// Streams a row of 16-byte chunks (the MI355 PR's FP8-quant input), four chunks per thread.
__global__ void hz_earlyclobber(const hz_f4* __restrict__ src, hz_f4* __restrict__ dst) {
  const unsigned tid = __builtin_amdgcn_workitem_id_x();
  const hz_f4* p = src + 4 * tid;
  hz_f4 r0 = {}, r1 = {}, r2 = {}, r3 = {};
#if HZ_SPLIT
  // hazards: allow(early-clobber) not flagged anyway: one instruction per statement
  asm volatile(HZ_LOAD_NT "%0, %1, off sc0 sc1 nt" : "=v"(r0) : "v"(p));
  asm volatile(HZ_LOAD_NT "%0, %1, off sc0 sc1 nt" : "=v"(r1) : "v"(p + 1));
#if HZ_LOADS > 2
  asm volatile(HZ_LOAD_NT "%0, %1, off sc0 sc1 nt" : "=v"(r2) : "v"(p + 2));
#endif
#if HZ_LOADS > 3
  asm volatile(HZ_LOAD_NT "%0, %1, off sc0 sc1 nt" : "=v"(r3) : "v"(p + 3));
#endif
  asm volatile("s_waitcnt vmcnt(0)" ::: "memory");
#else
  // hazards: allow(early-clobber) the broken variants seed this hazard on purpose; the
  // catalog check compiles every variant and requires it to be flagged.
  asm volatile(
      HZ_LOAD_NT "%0, " HZ_SRC(4, 0)
      HZ_LOAD_NT "%1, " HZ_SRC(5, 16)
#if HZ_LOADS > 2
      HZ_LOAD_NT "%2, " HZ_SRC(6, 32)
#endif
#if HZ_LOADS > 3
      HZ_LOAD_NT "%3, " HZ_SRC(7, 48)
#endif
      "s_waitcnt vmcnt(0)"
      : HZ_OUT(r0), HZ_OUT(r1), HZ_OUT(r2), HZ_OUT(r3)
      : "v"(p), "v"(p + 1), "v"(p + 2), "v"(p + 3)
      : "memory");
#endif
  hz_f4* q = dst + 4 * tid;
  q[0] = r0;
  q[1] = r1;
#if HZ_LOADS > 2
  q[2] = r2;
#endif
#if HZ_LOADS > 3
  q[3] = r3;
#endif
}
