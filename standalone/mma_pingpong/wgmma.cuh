// wgmma.cuh -- the sm_90a warpgroup MMA pieces family mma_pingpong is built from: the
// no-swizzle K-major shared-memory layout, its matrix descriptors, wgmma.mma_async for
// m64n{64,128,256}k16 bf16 -> f32, fence/commit/wait, and the accumulator fragment map.
//
// Layout (PTX ISA, "Shared Memory Matrix Layout", K-major, no swizzle): the canonical
// layout is ((8,m),(8,2k)):((8,SBO),(1,LBO)) in bf16 elements, i.e. "core matrices" of
// 8 rows x 8 elements (8 x 16 bytes, rows contiguous, 128 bytes). We store a tile of R
// rows x BK elements as core matrices ordered K-group-major: core (row group i, k group j)
// sits at byte (j * R/8 + i) * 128. So SBO (next 8 rows) = 128 bytes and LBO (next 8 k)
// = R * 16 bytes; a k16 step kk starts 2*kk*LBO bytes into the tile.
// A is 64 x BK (K-major, "row-major A"); B is BN x BK (K-major, i.e. B^T row-major):
// D(64 x BN) += A * B with imm-trans-a = imm-trans-b = 0.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace mma {

constexpr int kBM = 64;          // rows of A and D per warpgroup (wgmma's M)
constexpr int kCoreBytes = 128;  // one 8 x 16-byte core matrix

// Element offset of (r, k) inside an R x BK tile stored in the layout above.
__host__ __device__ constexpr int tile_offset(int r, int k, int rows) {
  return ((k >> 3) * (rows >> 3) + (r >> 3)) * (kCoreBytes / 2) + (r & 7) * 8 + (k & 7);
}

// The byte address the hardware reads for (r, k) from a descriptor (start, LBO, SBO),
// written from the PTX canonical formula, independently of tile_offset: the static_assert
// in the kernel file checks that the descriptor we build addresses what the tiler wrote.
__host__ __device__ constexpr int descriptor_byte(int r, int k, int lbo, int sbo) {
  return (k / 16) * 2 * lbo + (r % 8) * 16 + (r / 8) * sbo + (k % 8) * 2 + ((k % 16) / 8) * lbo;
}

template <int R, int BK>
__host__ __device__ constexpr bool layout_consistent() {
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < BK; ++k)
      if (descriptor_byte(r, k, R * 16, kCoreBytes) != 2 * tile_offset(r, k, R)) return false;
  return true;
}

// Matrix descriptor (PTX "Matrix Descriptor Format"): start address, LBO and SBO, each
// encoded as (x & 0x3FFFF) >> 4; base offset 0 and swizzle mode 0 (none).
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_byte_addr, uint32_t lbo_bytes) {
  return (uint64_t)((smem_byte_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)(kCoreBytes >> 4) << 32);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across the asm statements that
// start and retire a wgmma (it sees a read-modify-write of every register). Emits nothing.
template <int R>
__device__ __forceinline__ void fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define HZ_ACC4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define HZ_ACC16(i) HZ_ACC4(i), HZ_ACC4(i + 4), HZ_ACC4(i + 8), HZ_ACC4(i + 12)
#define HZ_ACC32(i) HZ_ACC16(i), HZ_ACC16(i + 16)
#define HZ_ACC64(i) HZ_ACC32(i), HZ_ACC32(i + 32)
#define HZ_ACC128(i) HZ_ACC64(i), HZ_ACC64(i + 64)
#define HZ_WGMMA_D64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define HZ_WGMMA_D128 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define HZ_WGMMA_D256 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
// D += A * B (scale-d = 1: accumulate), both operands from shared memory (descriptors).
template <int N>
__device__ __forceinline__ void mma_async(float (&d)[N / 2], uint64_t da, uint64_t db);

template <>
__device__ __forceinline__ void mma_async<64>(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HZ_WGMMA_D64 ", %32, %33, 1, 1, 1, 0, 0;"
               : HZ_ACC32(0)
               : "l"(da), "l"(db));
}
template <>
__device__ __forceinline__ void mma_async<128>(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " HZ_WGMMA_D128 ", %64, %65, 1, 1, 1, 0, 0;"
               : HZ_ACC64(0)
               : "l"(da), "l"(db));
}
template <>
__device__ __forceinline__ void mma_async<256>(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " HZ_WGMMA_D256 ", %128, %129, 1, 1, 1, 0, 0;"
               : HZ_ACC128(0)
               : "l"(da), "l"(db));
}

// Accumulator fragment (PTX "Register Fragments", m64nNk16 D): register i of thread t
// (warp w = t/32, lane l) holds D[16w + l/4 + 8*((i/2)%2)][8*(i/4) + 2*(l%4) + i%2].
__host__ __device__ constexpr int acc_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
__host__ __device__ constexpr int acc_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + (i % 2); }

}  // namespace mma
