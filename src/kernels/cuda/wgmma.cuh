// Hopper tensor-core helpers shared by the prefill kernels (indexer_prefill.cu,
// attention_prefill.cu): proxy and wgmma fences, shared-memory matrix descriptors with 128-byte
// swizzle, wgmma.m64n128k16 (bf16 -> fp32) with A from shared memory or registers, the
// mma.sync m16n8k16 that works on the same accumulator layout, and the swizzled tile layout.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace sieve::cuda {

// Generic-proxy shared-memory writes (st.shared, cp.async) -> visible to wgmma (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Every committed group but the newest one is complete.
__device__ __forceinline__ void wgmma_wait_1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
// Pins the accumulators around the asynchronous MMAs (no register move crosses the fences).
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor with 128-byte swizzle. K-major: lbo unused (K fits the
// swizzle), sbo = 1024 B between 8-row groups. MN-major: lbo = the step to the next 64 elements
// along M/N, sbo = the step to the next 8 along K.
__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = uint64_t((saddr & 0x3FFFFu) >> 4);  // start address
  d |= uint64_t((lbo >> 4) & 0x3FFFu) << 16;       // leading byte offset
  d |= uint64_t((sbo >> 4) & 0x3FFFu) << 32;       // stride byte offset
  d |= uint64_t(1) << 62;                          // 128B swizzle
  return d;
}
// K-major, 8-row groups 1024 B apart.
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr) { return smem_desc(saddr, 16, 1024); }

// make_desc(saddr + off) from d = make_desc(saddr), for a 16-byte multiple off that keeps the
// address inside shared memory (the 14-bit start field cannot carry into the next field): one
// add on the low word instead of the mask, shift and or of a fresh descriptor.
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t off) { return d + (off >> 4); }

#define SIEVE_WGMMA_D64                                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define SIEVE_WGMMA_OUT64                                                                                          \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),      \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),      \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),      \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),      \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D[64 x 128] (+)= A[64 x 16] . B[128 x 16]^T, A and B (K-major) from shared memory, fp32
// accumulate.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SIEVE_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
               : SIEVE_WGMMA_OUT64
               : "l"(da), "l"(db), "r"(accumulate));
}

// The same with A from registers (the mma.sync m16n8k16 A fragment of each warp's 16 rows); B
// K-major (kTransB = 0) or MN-major (kTransB = 1).
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&af)[4], uint64_t db,
                                                    int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SIEVE_WGMMA_D64
               ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
               : SIEVE_WGMMA_OUT64
               : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]), "l"(db), "r"(accumulate), "n"(kTransB));
}
#undef SIEVE_WGMMA_D64
#undef SIEVE_WGMMA_OUT64

#define SIEVE_WGMMA_D32                                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define SIEVE_WGMMA_OUT32                                                                                         \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),     \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),      \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),     \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// D[64 x 64] (+)= A[64 x 16] . B[64 x 16]^T, A from registers (as wgmma_m64n128k16_rs), B K-major
// from shared memory: d[4 j + {0, 1}] is row (warp's row g), columns 8 j + 2 q + {0, 1}; d[4 j +
// {2, 3}] row g + 8 (the first half of the m64n128 layout).
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&af)[4], uint64_t db,
                                                   int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SIEVE_WGMMA_D32
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
               : SIEVE_WGMMA_OUT32
               : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]), "l"(db), "r"(accumulate));
}
#undef SIEVE_WGMMA_D32
#undef SIEVE_WGMMA_OUT32

// D[16 x 8] += A[16 x 16] . B[16 x 8] (mma.sync, bf16, fp32 accumulate), D at d[0..3]: n-tile j
// of a warp's 16 rows of a wgmma accumulator is d = &acc[4 * j].
__device__ __forceinline__ void mma_bf16_4(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A 128-row bf16 tile of 128 dims as two 64-dim halves of 128 rows x 128 B, each row's 16-byte
// units swizzled (unit u of row r at u ^ (r & 7)): the layout of 128-byte-swizzle wgmma operands
// and of 2-D TMA boxes of 128 rows x 64 dims with 128-byte swizzle.
constexpr int kSwzHalfBytes = 128 * 128;
// Byte offset of (row, dim); dim % 8 == 0 gives the start of a 16-byte unit.
__device__ __forceinline__ int swz(int row, int dim) {
  const int u = (dim & 63) >> 3;
  return (dim >> 6) * kSwzHalfBytes + row * 128 + ((u ^ (row & 7)) << 4) + (dim & 7) * 2;
}

}  // namespace sieve::cuda
