// Device helpers of the FP8 MoE kernels (moe_fp8*.cu): fp8 wgmma, 2-D TMA loads through tensor
// maps in global memory (the per-expert weight maps are written on the device, see moe_fp8.cu),
// 4-byte cp.async into an mbarrier's phase, and the 1 x 128 activation quantizer.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/setmaxnreg.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace sieve::cuda::moe_fp8 {

// The 1 x 128 activation quantizer of the FP8 contract, bit for bit the CPU's
// (cpu::quantize_row_fp8): scale = amax / 448 (1 when amax is 0), q = sat_fp8(x / scale), both
// divisions IEEE fp32, the cast rounding to nearest even and saturating. fmaxf ignores NaN as the
// CPU's amax does. (A device twin of the fused quantizer of the linear kernels; one of the two
// should go once both have landed.)
constexpr int kGroup = 128;
__device__ __forceinline__ float group_scale(float amax) { return amax == 0.0f ? 1.0f : __fdiv_rn(amax, 448.0f); }
__device__ __forceinline__ uint8_t quant(float x, float scale) { return f32_to_fp8_bits(__fdiv_rn(x, scale)); }

// D[64 x N] (+)= A[64 x 32] . B[N x 32]^T, fp8 e4m3 operands from shared memory (K-major,
// 128-byte swizzle descriptors), fp32 accumulators in the m64nN layout: d[4 j + 2 r + i] is row
// 16 w + g + 8 r (warp w of the warpgroup, lane = 4 g + q), column 8 j + 2 q + i.
template <int N>
__device__ __forceinline__ void wgmma_fp8(float (&d)[N / 2], uint64_t da, uint64_t db, int acc);

template <>
__device__ __forceinline__ void wgmma_fp8<8>(float (&d)[4], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3"
      "}, %4, %5, p, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(acc));
}

template <>
__device__ __forceinline__ void wgmma_fp8<16>(float (&d)[8], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, %8, %9, p, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(da), "l"(db), "r"(acc));
}

template <>
__device__ __forceinline__ void wgmma_fp8<32>(float (&d)[16], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}

template <>
__device__ __forceinline__ void wgmma_fp8<64>(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}

template <>
__device__ __forceinline__ void wgmma_fp8<128>(float (&d)[64], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(da), "l"(db), "r"(acc));
}

// 2-D tiled TMA load of box (x = column, y = row) of `map` (a tensor map in global or parameter
// memory, by its generic address) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const void* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_u32(bar))
      : "memory");
}
// The same with an L2 cache policy (weights streamed once: evict first).
__device__ __forceinline__ void tma_load_hint(void* dst, const void* map, int x, int y, uint64_t* bar,
                                              uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// A tensor map written in global memory by an earlier kernel (generic proxy) becomes visible to
// this thread's TMA loads (tensormap proxy).
__device__ __forceinline__ void tensormap_acquire(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(map))
               : "memory");
}
// Writer side: `map` (128 bytes in global memory, a copy of a valid map) gets the global address
// `addr`; then the release fence for the readers' acquire.
__device__ __forceinline__ void tensormap_set_address(void* map, const void* addr) {
  asm volatile("tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "l"(reinterpret_cast<uint64_t>(addr))
               : "memory");
}
__device__ __forceinline__ void tensormap_release() {
  asm volatile("fence.proxy.tensormap::generic.release.gpu;\n" ::: "memory");
}

// 4 bytes by cp.async (through L1), zeros when !valid (src must still be a valid address).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
// Arrives on `bar` once this thread's earlier cp.async copies have landed (the arrival is one of
// the barrier's expected count: .noinc).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Named barrier over `threads` threads (whole warps) of the CTA.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace sieve::cuda::moe_fp8

namespace sieve::cuda::moe_fp8 {

// Arguments of the two grouped products (gate_up, down), for both kernel families: the tile
// kernels (prefill, moe_fp8_tile.cu) and the stream kernels (decode, moe_fp8_stream.cu).
// Rows are the sort's: expert e owns sorted rows offsets[e] .. offsets[e + 1] - 1 and row blocks
// blk_start[e] .. blk_start[e + 1] - 1 (of the kernel's row-block size); work item i of the
// grid-stride loop is moe_fp8_work.h's work_item.
struct GemmArgs {
  const CUtensorMap* wmaps;    // [E] per-expert weight maps of this product (written by the sort)
  const float* const* wscale;  // [E] -> dequant multipliers, blocks of (sbr, 128)
  int sbr;                     // scale block rows
  // wscale tiled ([rbs][nkb][256], sbr 1: ops::MoeExpertsParams::scale_tiled, ops::
  // fp8_scales_moe_tiled: the kernels' 256-row blocks in their row order, zeros past the rows),
  // each array 16-byte aligned: the stream kernels bulk-copy a stage's k blocks of a row block as
  // one run, the tile kernels (k-block-major modes) read them in place of wst.
  bool wtiled;
  int nkb;                     // k blocks of 128 (ceil(K / 128))
  int inter, hidden;           // I and H
  // The activation rows' 1 x 128 scales, by sorted row: [rows_cap][nkb] (tile kernels, row-major
  // mode) or k-block-major [nkb][rows_cap] (stream kernels; tile kernels, k-block-major modes).
  const float* a_scale;
  int rows_cap;                // rows of the activation buffers
  const int32_t* offsets;      // [E + 1]
  const int32_t* blk_start;    // [E + 1]
  const int32_t* sorted;       // [rows] pair index (token * topk + slot) of each sorted row
  int E;
  int cols;    // work items a row block: tile kernels, weight-row tiles; stream kernels, rb * ksplit
  int ksplit;  // stream kernels: k splits of a row block's k range
  // Stream kernels: > 0, the kernel picks the k split itself (moe_fp8_work.h pick_ksplit, up to
  // this many, from the sort's row blocks and its grid); cols is then the weight-row blocks and
  // ksplit 1.
  int ksplit_max;
  int kp;      // stream kernels: k blocks of 128 a pipeline stage
  int experiment;  // MoeTuning::fp8_stream_experiment (stream kernels) or fp8_tile_experiment (tile kernels)
  // gate_up: the SwiGLU rows quantized for down, by sorted row.
  uint8_t* act_q;       // [rows_cap, ld_act]
  int64_t ld_act;
  float* act_scale;     // [rows_cap][ceil(I / 128)], k-block-major as a_scale
  // down: each pair's expert output, bf16, by pair.
  uint16_t* y;          // [pairs, H]
  float alpha, limit, beta;
  // stream kernels with ksplit > 1: fp32 partial sums and arrival counters (returned to zero).
  float* partial;
  int32_t* counters;
  // Tile kernels with k-block-major scales (MoeTuning::fp8_tile_kmajor_scales, or wtiled): a_scale
  // and act_scale are [nkb][rows_cap] and [ceil(I / 128)][rows_cap] (so are they for the stream
  // kernels, rows_cap a multiple of 4), the weight scales wst [E][cols][nkb][256] (the call's tiled
  // copy of row-major ones; null with wtiled) (wn: the product's weight rows, 2 I or H; also set
  // for the stream kernels).
  const float* wst;
  int wn;
  // Tile kernels with bulk scales (MoeTuning::fp8_tile_staged_out): the epilogue writes its rows
  // into shared memory and bulk-stores them a row at a time, instead of storing each thread's
  // fragments straight to global memory.
  bool staged_out;
  // Tile kernels (MoeTuning::fp8_tile_dynamic): two int32 counters, zero at the launch and
  // returned to zero by its last CTA: the next tile to claim (less gridDim.x) and the CTAs done
  // claiming. Null: the static order (tile blockIdx.x + k gridDim.x).
  int32_t* tile_counter;
};

// An expert matrix's weight map (moe_fp8.cu): row-major [rows, cols] fp8, boxes of 64 rows x 128
// bytes with the 128-byte swizzle, as the tile and stream kernels read them (also the bench's read
// probe). False when the driver refuses it.
bool weight_map(CUtensorMap* map, const void* base, int64_t rows, int64_t cols);

// Tile kernels: the experts' weight maps of one product as a kernel parameter (encoded on the
// host), for up to kTileParamMaps experts.
constexpr int kTileParamMaps = 128;
struct TileMaps {
  CUtensorMap m[kTileParamMaps];
};

// How the tile kernels' producer reads the scales: the row-major layouts by 4-byte cp.async, the
// tiled weight scales and k-block-major activation scales (GemmArgs::wst or wtiled; rows_cap a
// multiple of 4 for kBulk) by 4-byte cp.async, or by bulk copies that the stage's barrier counts
// in bytes.
enum class TileScales { kRowMajor, kKmajor, kBulk };

// Launch of the tile kernels (128 rows x 256 weight rows a tile; g.staged_out: the staged
// epilogue, with kBulk scales only; g.tile_counter: the dynamic tile order). maps: the weight
// maps as a parameter (null: the sort's maps in global memory, g.wmaps; only with k-block-major
// scales). block_w (kBulk only): weight multipliers constant over each
// half's gate rows and up rows (down: over each half), as with blocks of 128 rows or more: one
// multiplier a run in the promotion.
void launch_tiles(bool gate_up, const CUtensorMap& amap, const GemmArgs& g, int grid, cudaStream_t st,
                  TileScales scales = TileScales::kRowMajor, const TileMaps* maps = nullptr,
                  bool block_w = false);
// Stream kernels (256 weight rows x `nt` token rows a work unit, nt = 8, 16, 32 or 64; a
// pipeline stage holds g.kp k blocks of them, 1 to 4).
size_t stream_smem_bytes(int nt);
void launch_stream(bool gate_up, int nt, const CUtensorMap& amap, const GemmArgs& g, int grid, bool pdl,
                   cudaStream_t st);

// Shared memory rounded up to 1024 bytes (128-byte swizzled TMA boxes and wgmma operands).
__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  const uint32_t a = smem_u32(p);
  return p + ((1024u - (a & 1023u)) & 1023u);
}

}  // namespace sieve::cuda::moe_fp8
