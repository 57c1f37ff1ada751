// One wgmma.mma_async m64n8k16 (f16 in, f32 accumulate, both operands from shared-memory
// descriptors) on the accumulators d0..d3 in scope: the tests' small wgmma kernels share it.
#pragma once
#include <cstdint>
#define HZ_WGMMA(da, db)                                                                    \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, " \
               "p, 1, 1, 0, 0;\n}\n"                                                         \
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)                                      \
               : "l"(da), "l"(db), "r"(1))
