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
#include <cmath>
#include <cstdint>

#include "kernels/cuda/tuning.h"

#ifdef __CUDACC__
#define SIEVE_HD __host__ __device__ __forceinline__
#define SIEVE_UNROLL _Pragma("unroll")
#else
#define SIEVE_HD inline
#define SIEVE_UNROLL
#endif

namespace sieve::cuda {

namespace fp8 {

constexpr int kBK = 128;       // k of one block: one activation scale group, one TMA box row
constexpr int kWgRows = 64;    // weight rows of a consumer warpgroup (the wgmma M)
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
SIEVE_HD int split_kb(const Plan& p, int s) {
  return int((int64_t(s) * p.kb_total) / p.splits);
}

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
SIEVE_HD int acc_row(int wg, int warp, int lane, int i) {
  return wg * kWgRows + warp * 16 + (lane >> 2) + ((i >> 1) & 1) * 8;
}
SIEVE_HD int acc_col(int lane, int i) {
  return (i >> 2) * 8 + (lane & 3) * 2 + (i & 1);
}

// The finished partial tile is staged in shared memory token-major, [bn][bm + 4] fp32 (the pad
// spreads a warp's stores over the 32 banks), where the cluster's CTAs read it.
SIEVE_HD int stage_pitch(int bm) {
  return bm + 4;
}
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
SIEVE_HD int64_t w_scale_index(int64_t row, int br, int kb_total, int kb) {
  return (row / br) * kb_total + kb;
}

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
SIEVE_HD int smem_request(const Plan& p) {
  return smem_layout(p).total + 1024;
}
// The staged tile must fit in the stage ring it reuses.
SIEVE_HD bool staging_fits(const Plan& p) {
  return p.bn * stage_pitch(p.bm()) * 4 <= p.stages * smem_layout(p).stage_bytes;
}

// One k block's promotion of a consumer thread: acc += blk * (w_scale(row) * x_scale(token)),
// w0 / w1 the scales of its rows acc_row(.., 0) and acc_row(.., 2), xs the stage's token scales.
template <int BN>
SIEVE_HD void promote_block(float (&acc)[BN / 2], const float (&blk)[BN / 2], const float* xs,
                            float w0, float w1, int lane) {
  SIEVE_UNROLL
  for (int j = 0; j < BN / 8; ++j) {
    SIEVE_UNROLL
    for (int c = 0; c < 2; ++c) {
      const float xv = xs[acc_col(lane, 4 * j + c)];
      acc[4 * j + c] = fmaf(blk[4 * j + c], w0 * xv, acc[4 * j + c]);
      acc[4 * j + 2 + c] = fmaf(blk[4 * j + 2 + c], w1 * xv, acc[4 * j + 2 + c]);
    }
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Byte `b` (0..127) of token row `r` of a stage's token tile: where the 128-byte-swizzled tensor
// copy puts it (16-byte chunk c of a row lands at chunk c ^ (r % 8); the tile is 1024-byte
// aligned), and so where the GEMM's own quantizer writes it.
SIEVE_HD int x_tile_offset(int r, int b) {
  return r * kBK + ((((b >> 4) ^ r) & 7) << 4) + (b & 15);
}

// The plan for m tokens times an n x k weight on a GPU of `sms` multiprocessors with `max_smem`
// bytes of shared memory a CTA, under the knobs t.
inline Plan make_plan(int64_t m, int64_t n, int64_t k, int sms, int max_smem,
                      const LinearTuning& t) {
  Plan p;
  p.kb_total = int(ceil_div(k, kBK));
  p.wgs = t.wgs == 1 || t.wgs == 2 ? t.wgs : (m <= 64 ? 1 : 2);
  if (t.bn == 8 || t.bn == 16 || t.bn == 32 || t.bn == 64 || t.bn == 128)
    p.bn = t.bn;
  else
    p.bn = m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : 128;
  p.tiles_n = int(ceil_div(n, p.bm()));
  p.tiles_m = int(ceil_div(m, p.bn));
  // Ring depth: the large tiles as deep as shared memory allows (one CTA an SM); the decode tiles
  // ~72 KB (a few CTAs an SM, each with all or most of its k range in flight).
  const SmemLayout l = smem_layout(p);
  if (t.stages >= 2 && t.stages <= kMaxStages)
    p.stages = t.stages;
  else if (p.wgs == 2 && p.bn == 128)
    p.stages = kMaxStages;
  else
    p.stages = std::clamp(73728 / (l.stage_bytes + l.scale_stage), 2, kMaxStages);
  while (p.stages > 2 && smem_request(p) > max_smem) --p.stages;
  while (!staging_fits(p) && p.stages < kMaxStages) ++p.stages;
  // Split k (decode shapes: few tiles). The fewest splits that give every SM a CTA, where each
  // CTA's k range then fits in about one ring (kMaxStages blocks: nearly all its weights in
  // flight at once, and the fewest CTAs to reduce); else split while the tiles leave resident
  // CTA slots empty (max_ctas_per_sm an SM), keeping at least 2 k blocks a split unless that
  // leaves SMs idle. On an H100 at one TP4 / TP8 rank's shapes the first rule is the faster for
  // o_proj and the down projections of k <= 2048 (up to 17 %), the second for qkv and gate_up.
  const int64_t tiles = int64_t(p.tiles_n) * p.tiles_m;
  if (t.splits >= 1) {
    p.splits = std::min({t.splits, kMaxSplits, p.kb_total});
  } else {
    const int cover = int(std::min<int64_t>({ceil_div(sms, tiles), p.kb_total, kMaxSplits}));
    if (ceil_div(p.kb_total, cover) <= kMaxStages) {
      p.splits = cover;
    } else {
      const int max_splits = std::clamp(p.kb_total / 2, 1, kMaxSplits);
      const int64_t slots = int64_t(sms) * (t.max_ctas_per_sm > 0 ? t.max_ctas_per_sm : 2);
      p.splits = tiles >= slots ? 1 : int(std::min<int64_t>(max_splits, ceil_div(slots, tiles)));
      p.splits = std::max(p.splits, cover);
    }
  }
  return p;
}

}  // namespace fp8
}  // namespace sieve::cuda
