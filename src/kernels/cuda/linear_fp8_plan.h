// The index arithmetic of the FP8 GEMM kernel (linear_fp8.cu): its launch plan, which CTA owns
// which tile and k range, where each accumulator of a thread sits in the tile, the shared-memory
// layout, the staged-tile pitch and each split's slice of the reduction. Plain C++ usable on the
// host too, so that tests/kernels/kernels_linear_emulation_test.cpp runs the kernel's bookkeeping
// on the CPU with these very functions.
//
// The product is computed transposed ("swap AB"): the wgmma M side is the weight rows (64 a
// consumer warpgroup), the N side the tokens (bn a CTA), so a decode batch of a few tokens fills
// an m64nBN instruction with BN as small as 8. A CTA owns bm = 64 * wgs weight rows x bn tokens
// and the k blocks [kb_begin, kb_end) of its split; the `splits` CTAs of one tile form a thread
// block cluster and sum their partial tiles through distributed shared memory in a fixed order.
#pragma once

#include <algorithm>
#include <cstdint>

#ifdef __CUDACC__
#define SIEVE_HD __host__ __device__ __forceinline__
#else
#define SIEVE_HD inline
#endif

namespace sieve::cuda::fp8 {

constexpr int kBK = 128;      // k of one block: one activation scale group, one TMA box row
constexpr int kWgRows = 64;   // weight rows of a consumer warpgroup (the wgmma M)
constexpr int kMaxSplits = 8;  // portable cluster size
constexpr int kMaxStages = 8;

struct Plan {
  int wgs = 1;     // consumer warpgroups; bm = 64 * wgs weight rows a CTA
  int bn = 8;      // tokens a CTA: 8, 16, 32, 64 or 128
  int splits = 1;  // CTAs along k of one tile (the cluster size)
  int stages = 4;  // shared-memory ring depth
  int tiles_n = 0, tiles_m = 0;
  int kb_total = 0;  // ceil(k / 128)
  int group_m = 8;   // raster: token tiles that run together over the weight tiles (splits == 1)
  SIEVE_HD int bm() const { return kWgRows * wgs; }
  // The consumer warpgroups (warps 0 .. 4 wgs - 1), then the producer warp. With 2 consumer
  // warpgroups a thread may hold 224 registers (65536 / 288), room for the 64 running sums and
  // the 64 of a block that an m64n128 tile needs each.
  SIEVE_HD int threads() const { return 128 * wgs + 32; }
  SIEVE_HD int grid_x() const { return tiles_n * splits; }
};

// k blocks of split s: [split_kb(s), split_kb(s + 1)); non-empty while splits <= kb_total.
SIEVE_HD int split_kb(const Plan& p, int s) { return int((int64_t(s) * p.kb_total) / p.splits); }

// The tile and split of CTA (bx, by). With splits > 1 the grid is (tiles_n * splits, tiles_m)
// and a cluster is `splits` consecutive x; otherwise the CTAs are rasterised in groups of
// group_m token tiles, so that the CTAs running together share weight and token tiles in L2.
SIEVE_HD void cta_tile(const Plan& p, int bx, int by, int& tile_n, int& tile_m, int& split) {
  if (p.splits > 1) {
    tile_n = bx / p.splits;
    split = bx % p.splits;
    tile_m = by;
    return;
  }
  split = 0;
  const int id = by * p.tiles_n + bx;
  const int per_group = p.group_m * p.tiles_n;
  const int first_m = (id / per_group) * p.group_m;
  const int gsz = std::min(p.tiles_m - first_m, p.group_m);
  const int in = id % per_group;
  tile_m = first_m + in % gsz;
  tile_n = in / gsz;
}

// Accumulator i of a consumer thread (warpgroup wg, warp w of it, lane l) of an m64nBN wgmma
// with fp32 accumulators: tile row (weight row) and column (token). Registers 4j + {0, 1} are
// row 16w + l/4, columns 8j + 2(l%4) + {0, 1}; 4j + {2, 3} the row 8 below.
SIEVE_HD int acc_row(int wg, int warp, int lane, int i) { return wg * kWgRows + warp * 16 + (lane >> 2) + ((i >> 1) & 1) * 8; }
SIEVE_HD int acc_col(int lane, int i) { return (i >> 2) * 8 + (lane & 3) * 2 + (i & 1); }

// The finished partial tile is staged in shared memory token-major, [bn][bm + 4] fp32 (the pad
// spreads a warp's stores over the 32 banks), where the cluster's CTAs read it.
SIEVE_HD int stage_pitch(int bm) { return bm + 4; }
// Flat elements e = token * bm + row of the tile that split r sums and stores: [e0, e1), runs
// of 4 consecutive rows of one token.
SIEVE_HD void reduce_slice(int bm, int bn, int splits, int r, int& e0, int& e1) {
  const int total = bm * bn;
  const int chunk = ((total + splits - 1) / splits + 3) / 4 * 4;
  e0 = std::min(total, r * chunk);
  e1 = std::min(total, e0 + chunk);
}

// Dequantization multiplier index of weight row `row` at k block kb (scale blocks of br rows by
// 128 columns, row-major over blocks).
SIEVE_HD int64_t w_scale_index(int64_t row, int br, int kb_total, int kb) { return (row / br) * kb_total + kb; }

// Shared memory of a CTA, offsets from a 1024-byte aligned base: the full / empty barriers, then
// per stage the weight tile (bm rows x 128 bytes) and the token tile (bn x 128), each 1024-byte
// aligned for the 128-byte swizzle, then per stage the bn token scales and bm weight scales.
struct SmemLayout {
  int w_tile, x_tile, stage_bytes, tiles, scales, scale_stage, total;
};
SIEVE_HD SmemLayout smem_layout(const Plan& p) {
  SmemLayout s{};
  s.tiles = 1024;  // barriers: 2 * stages * 8 bytes
  s.w_tile = p.bm() * kBK;
  s.x_tile = p.bn * kBK;
  s.stage_bytes = s.w_tile + s.x_tile;
  s.scales = s.tiles + p.stages * s.stage_bytes;
  s.scale_stage = (p.bn + p.bm()) * 4;
  s.total = s.scales + p.stages * s.scale_stage;
  return s;
}
// Bytes to request: the layout plus the alignment slack of the dynamic shared-memory base.
SIEVE_HD int smem_request(const Plan& p) { return smem_layout(p).total + 1024; }
// The staged tile must fit in the stage ring it reuses.
SIEVE_HD bool staging_fits(const Plan& p) {
  return p.bn * stage_pitch(p.bm()) * 4 <= p.stages * smem_layout(p).stage_bytes;
}

}  // namespace sieve::cuda::fp8
