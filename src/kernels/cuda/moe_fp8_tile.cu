// FP8 MoE, tile kernels (prefill batches; docs/kernels.md "FP8 MoE"): per expert, tiles of 128
// sorted rows x 256 weight rows, k in blocks of 128, on fp8 wgmma with fp32 accumulation.
//
// Tiles are numbered expert, weight-row tile, row tile (row tiles fastest). A persistent CTA of
// three warpgroups takes tile blockIdx.x, then by default (the dynamic order) the next unclaimed
// one from a counter each time it has issued a tile's last k block, so that the CTAs that share
// an expert's weight tile start it together and meet in L2 (or blockIdx.x + gridDim.x, ...):
//  - warpgroup 0, warp 0: the producer. Lane 0 issues the TMA loads of a k block into a ring of
//    4 stages (3 for down with the staged epilogue; the 128 activation rows as two 64-row boxes,
//    the 256 weight rows as four) and the stage's 256 weight-row scales and 128 activation-row
//    scales: by default (the weights' tiled scales, [rbs][nkb][256] in the tile's row order, their
//    own or the call's copy of row-major ones, and k-block-major activation scales) as 2 bulk
//    copies counted in the stage's bytes (1 arrival: the weight rows' 1 KB run and the activation
//    rows' from the 16-byte boundary at or before the tile's first row), else by 4-byte cp.async
//    from the 32 lanes, each arriving when its copies land (33 arrivals and the TMA bytes). The
//    weight maps come from the kernel parameter (host-encoded) or from global memory (the sort's).
//  - warpgroups 1 and 2: the consumers, rows 0-63 and 64-127 of the tile. Per k block and half of
//    the weight rows (128 each): 4 wgmma.m64n128k32 into a temporary accumulator, then the
//    promotion final += temporary * (x scale of the row * weight scale of the column) in fp32.
//    Promotion per block of 128 is what keeps fp8 products accurate: the tensor cores'
//    accumulation of fp8 products is narrower than fp32, so no sum runs longer than 128 k there.
//    A warpgroup whose 64 rows are all past the tile's rows skips its products.
// gate_up: the 256 weight rows are 128 units' gate and up rows, as boxes [gate u0..u0+63 |
// up u0..u0+63 | gate u0+64.. | up u0+64..], so a thread holds each unit's gate and up sums in
// the same registers (columns j < 8 and j + 8 of a half). The epilogue applies SwiGLU-OAI,
// takes the row's amax over its 128 units (one quantization group: the tile is the group) with
// two quad shuffles, and writes the row quantized for down (fp8 + the group's scale).
// down: 256 hidden rows; the epilogue writes the pair's output row in bf16.
// Staged epilogue (bulk scales; MoeTuning::fp8_tile_staged_out, by default for chunks of 128 rows
// an expert or more): each warpgroup writes its 64 rows into a shared-memory buffer of their own,
// and the lanes of its first warp store them with one bulk copy a row (cp.async.bulk, shared to
// global), which runs on while the warpgroup starts its next tile; down's 64 KB buffer leaves
// room for 3 ring stages, not 4.
// Otherwise every thread stores its fragments (2 or 4 bytes of 8 rows an instruction).
// Registers: the final accumulators of a thread are 64 rows x 256 columns / 128 threads = 128
// fp32, the temporary 64 more; the consumer warpgroups raise their limit to 232 (setmaxnreg).
#include <cuda.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/moe_fp8.cuh"
#include "kernels/cuda/moe_fp8_work.h"

namespace sieve::cuda::moe_fp8 {

namespace {

constexpr int kTileRows = 128, kTileW = 256, kBK = 128, kStages = 4, kThreads = 384;
constexpr int kABytes = kTileRows * kBK;  // 16 KB: two 64-row boxes
constexpr int kWBytes = kTileW * kBK;     // 32 KB: four 64-row boxes
constexpr int kBox = 64 * kBK;            // one 64-row box
// Floats a stage: the weight rows' scales (permuted, or in tile row order with bulk copies), then the
// activation rows' (with bulk copies from the 16-byte boundary at or before the tile's first
// row: up to 3 more).
constexpr int kScales = kTileW + kTileRows + 4;
// Staged epilogue (MoeTuning::fp8_tile_staged_out): the tile's output rows in a buffer of their
// own (row strides padded by 16 bytes: a warp's fragment stores are free of bank conflicts), one
// bulk store a row. gate_up: 128 fp8 units a row (128 bytes); down: 256 bf16 columns (512
// bytes), with 3 ring stages instead of 4 to make room.
constexpr int out_stride(bool gate_up) { return gate_up ? 144 : 528; }
constexpr int stages_of(bool gate_up, bool staged) { return staged && !gate_up ? 3 : kStages; }
constexpr size_t smem_bytes(bool gate_up, bool staged) {
  const int st = stages_of(gate_up, staged);
  return 1024 + size_t(st) * (kABytes + kWBytes) + size_t(st) * kScales * 4 + 2 * st * 8 +
         (staged ? size_t(kTileRows) * out_stride(gate_up) : 0);
}
static_assert(smem_bytes(false, true) <= 227 * 1024 && smem_bytes(true, true) <= 227 * 1024 &&
                  smem_bytes(true, false) <= 227 * 1024,
              "tile kernels: shared memory");
static_assert(kScales * 4 % 16 == 0, "tile kernels: the staging buffer after the barriers is 16-byte aligned");

struct Tile {
  int e, col, r0, rows;
};
__device__ __forceinline__ Tile tile_of(const GemmArgs& g, int64_t i) {
  const WorkItem w = work_item(g.blk_start, g.E, i, g.cols);
  Tile t;
  t.e = w.e;
  t.col = w.col;
  t.r0 = g.offsets[w.e] + w.blk * kTileRows;
  t.rows = min(kTileRows, g.offsets[w.e + 1] - t.r0);
  return t;
}

template <bool kGateUp>
__device__ __forceinline__ int weight_row(const GemmArgs& g, int col, int c, bool& valid) {
  return kGateUp ? gate_up_row(col, c, g.inter, valid) : down_row(col, c, g.hidden, valid);
}

// gate_up's epilogue: the SwiGLU-OAI values of a thread's row r (units 64 h + 8 j + 2 q + ii of
// weight-row tile col: gate sums in columns j < 8 of a half, up sums in j + 8; zero past I) and
// their quantization group's scale (the row's amax over its quad: the tile is the group).
__device__ __forceinline__ float swiglu_row(const GemmArgs& g, const float (&fin)[2][64], int r, int q, int col,
                                            float (&v)[2][8][2]) {
  float amax = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int ii = 0; ii < 2; ++ii) {
        const int unit = col * 128 + 64 * h + 8 * j + 2 * q + ii;
        const float x = swiglu_oai_value(fin[h][4 * j + 2 * r + ii], fin[h][4 * (j + 8) + 2 * r + ii], g.alpha,
                                         g.limit, g.beta);
        v[h][j][ii] = unit < g.inter ? x : 0.0f;
        amax = fmaxf(amax, fabsf(v[h][j][ii]));
      }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  return group_scale(amax);
}

// One map for the kernels that read the sort's maps in global memory.
struct NoMaps {
  CUtensorMap m[1];
};

// Scale modes: kRowMajor, the row-major layouts by 4-byte cp.async (each arriving on the stage's
// barrier); kKmajor, the tiled weight scales (GemmArgs::wst, or the experts' own arrays with
// wtiled) and k-block-major activation scales by 4-byte cp.async; kBulk, the same layouts by bulk
// copies counted in the stage's transaction bytes (the stage completes on its bytes alone).
// Maps: TileMaps (weight maps in the parameter) or NoMaps (g.wmaps, written by the sort).
enum ScaleMode { kRowMajor = 0, kKmajor = 1, kBulk = 2 };

// The promotion of one k block's products t of half h (its 16 column groups j) into the half's
// final sums: fin += t x (the row's activation scale x the column's weight scale), the columns'
// scales from stage scales sc (bulk: in weight-row order at h * 128; otherwise wscale_slot's
// order), or (kBlockW) one multiplier for the half's gate rows and one for its up rows (down: one
// for the half).
template <int kMode, bool kBlockW, bool kGateUp>
__device__ __forceinline__ void promote(float (&fin)[64], const float (&t)[64], const float* sc, int h, int q,
                                        float xs0, float xs1) {
  if constexpr (kBlockW) {
    const float wg = sc[h * 128], wu = kGateUp ? sc[h * 128 + 64] : wg;
    const float p[2][2] = {{xs0 * wg, xs1 * wg}, {xs0 * wu, xs1 * wu}};
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
          const int k = 4 * j + 2 * r + ii;
          fin[k] = fmaf(t[k], p[j >= 8][r], fin[k]);
        }
    return;
  }
  const float4* ws4 = reinterpret_cast<const float4*>(sc + h * 128 + q * 32);
#pragma unroll
  for (int j2 = 0; j2 < 8; ++j2) {
    // columns (j, i) = (2 j2, 0), (2 j2, 1), (2 j2 + 1, 0), (2 j2 + 1, 1)
    float wv[4];
    if (kMode == kBulk) {  // weight rows in order: column 8 j + 2 q + i at h * 128 + that
      const float2 u0 = *reinterpret_cast<const float2*>(sc + h * 128 + 16 * j2 + 2 * q);
      const float2 u1 = *reinterpret_cast<const float2*>(sc + h * 128 + 16 * j2 + 8 + 2 * q);
      wv[0] = u0.x, wv[1] = u0.y, wv[2] = u1.x, wv[3] = u1.y;
    } else {
      const float4 v = ws4[j2];
      wv[0] = v.x, wv[1] = v.y, wv[2] = v.z, wv[3] = v.w;
    }
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int j = 2 * j2 + jj;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
          const int k = 4 * j + 2 * r + ii;
          fin[k] = fmaf(t[k], (r ? xs1 : xs0) * wv[2 * jj + ii], fin[k]);
        }
    }
  }
}

template <bool kGateUp, int kMode, class Maps, bool kBlockW, bool kStaged>
__global__ void __launch_bounds__(kThreads, 1)
    tile_kernel(const __grid_constant__ CUtensorMap amap, const GemmArgs g, const __grid_constant__ Maps pmaps) {
  static_assert(!kBlockW || kMode == kBulk, "block weight multipliers: bulk scales only");
  static_assert(!kStaged || kMode == kBulk, "staged epilogue: bulk scales only");
  constexpr bool kParamMaps = sizeof(Maps) > sizeof(NoMaps);
  constexpr bool kKmaj = kMode != kRowMajor;
  constexpr int kStages = stages_of(kGateUp, kStaged);
  constexpr int kOut = out_stride(kGateUp);
  extern __shared__ uint8_t tile_smem_raw[];
  __shared__ int32_t tile_ids[kStages];  // the tile of each stage's first k block (-1: the end)
  uint8_t* const smem = align1024(tile_smem_raw);
  uint8_t* const a_ring = smem;
  uint8_t* const w_ring = smem + kStages * kABytes;
  float* const s_ring = reinterpret_cast<float*>(w_ring + kStages * kWBytes);
  uint64_t* const full = reinterpret_cast<uint64_t*>(s_ring + kStages * kScales);
  uint64_t* const empty = full + kStages;
  uint8_t* const out_buf = reinterpret_cast<uint8_t*>(empty + kStages);  // kStaged: 128 rows x kOut bytes
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], kMode == kBulk ? 1 : 33);  // the TMA issuer's expect_tx (and the 32 scale lanes)
      mbar_init(&empty[s], 8);  // the 8 consumer warps
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int64_t total = int64_t(g.blk_start[g.E]) * g.cols;

  if (warp < 4) {
    regs_dec<40>();
    if (warp != 0) return;
    // Producer.
    int s = 0;
    uint32_t ep = 1;
    const CUtensorMap* acquired = nullptr;
    // Tiles: blockIdx.x first, then blockIdx.x + gridDim.x, ... or (g.tile_counter: the dynamic
    // order) the next unclaimed one, claimed once this one's last k block is issued, so that the
    // CTAs take tiles in about the order they finish their last ones: the CTAs that share an
    // expert's weight tile start it together and read its k blocks from L2 at about the same
    // time, whatever each one's previous tile cost (a tile of 64 rows or fewer runs on one
    // warpgroup and ends early). Each tile's first stage carries its index to the consumers.
    for (int64_t i = blockIdx.x; i < total;) {
      const Tile t = tile_of(g, i);
      // Timing experiments (MoeTuning::fp8_tile_experiment; wrong results): bit 0 every tile's
      // weights and their scales from expert 0, bit 1 every tile's activation rows from row 0.
      const int ew = (g.experiment & 1) ? 0 : t.e;
      const int ar0 = (g.experiment & 2) ? 0 : t.r0;
      const CUtensorMap* wm = kParamMaps ? &pmaps.m[ew] : g.wmaps + ew;
      if (lane == 0 && wm != acquired) {
        if (kParamMaps) {
          prefetch_tensor_map(wm);
        } else {
          tensormap_acquire(wm);
        }
        acquired = wm;
      }
      // Row-major scales, or (k-block-major modes) the tile's row block of the expert's own tiled
      // array when the weights come with one (g.wtiled), else of the call's tiled copy wst.
      const float* ws = !kKmaj ? g.wscale[ew]
                               : (g.wtiled ? g.wscale[ew] : g.wst + int64_t(ew) * g.cols * g.nkb * kTileW) +
                                     int64_t(t.col) * g.nkb * kTileW;
      for (int kb = 0; kb < g.nkb; ++kb) {
        mbar_wait(&empty[s], ep);
        if (kb == 0 && lane == 0) tile_ids[s] = int32_t(i);  // before the stage's arrival (release)
        float* sc = s_ring + s * kScales;
        if (kMode == kBulk && lane == 0) {
          const int64_t a0 = int64_t(kb) * g.rows_cap + t.r0;
          const int shift = t.r0 & 3;
          const uint32_t abytes = uint32_t((shift + t.rows + 3) / 4 * 16);
          mbar_expect_tx(&full[s], kABytes + kWBytes + kTileW * 4 + abytes);
          bulk_copy(sc, ws + int64_t(kb) * kTileW, kTileW * 4, &full[s]);
          bulk_copy(&sc[kTileW], g.a_scale + (a0 - shift), abytes, &full[s]);
        } else if (lane == 0) {
          mbar_expect_tx(&full[s], kABytes + kWBytes);
        }
        if (lane == 0) {
          uint8_t* a = a_ring + s * kABytes;
          tma_load(a, &amap, kb * kBK, ar0, &full[s]);
          tma_load(a + kBox, &amap, kb * kBK, ar0 + 64, &full[s]);
          uint8_t* w = w_ring + s * kWBytes;
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            bool unused;
            tma_load(w + b * kBox, wm, kb * kBK, weight_row<kGateUp>(g, t.col, b * 64, unused), &full[s]);
          }
        }
        // Scales: 8 weight rows and 4 activation rows a lane (zeros past the rows). K-block-major:
        // row c = 32 k + lane, so that each instruction reads 32 consecutive floats.
        if (kMode == kBulk) {
          // in the stage's bytes
        } else if (kMode == kKmajor) {
          const float* wsk = ws + int64_t(kb) * kTileW;  // the tile's rows in order, zeros past the matrix
          const float* ask = g.a_scale + int64_t(kb) * g.rows_cap + t.r0;
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const int c = 32 * k + lane;
            cp_async4(&sc[wscale_slot(c)], wsk + c, true);
          }
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int r = 32 * k + lane;
            const bool ok = r < t.rows;
            cp_async4(&sc[kTileW + r], ok ? ask + r : g.a_scale, ok);
          }
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            bool ok;
            const int n = weight_row<kGateUp>(g, t.col, lane * 8 + k, ok);
            cp_async4(&sc[wscale_slot(lane * 8 + k)], ok ? ws + int64_t(n / g.sbr) * g.nkb + kb : ws, ok);
          }
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int r = lane * 4 + k;
            const bool ok = r < t.rows;
            cp_async4(&sc[kTileW + r], ok ? g.a_scale + int64_t(t.r0 + r) * g.nkb + kb : g.a_scale, ok);
          }
        }
        if (kMode != kBulk) cp_async_arrive(&full[s]);
        if (++s == kStages) s = 0, ep ^= 1;
      }
      if (g.tile_counter) {
        int64_t next = 0;
        if (lane == 0) next = int64_t(gridDim.x) + atomicAdd(g.tile_counter, 1);
        i = __shfl_sync(0xffffffffu, next, 0);
      } else {
        i += gridDim.x;
      }
    }
    // The end: a stage with tile index -1, completed by arrivals alone (33 with cp.async scales).
    mbar_wait(&empty[s], ep);
    if (lane == 0) tile_ids[s] = -1;
    __syncwarp();
    if (lane == 0) mbar_arrive(&full[s]);
    if (kMode != kBulk) mbar_arrive(&full[s]);
    if (g.tile_counter && lane == 0) {
      // The last CTA to finish claiming returns both counters to zero for the next call.
      __threadfence();
      if (atomicAdd(g.tile_counter + 1, 1) == int(gridDim.x) - 1) {
        __threadfence();
        atomicExch(g.tile_counter, 0);
        atomicExch(g.tile_counter + 1, 0);
      }
    }
    return;
  }

  // Consumers.
  regs_inc<232>();
  const int c = (warp >> 2) - 1, w = warp & 3, g8 = lane >> 2, q = lane & 3;
  int s = 0;
  uint32_t fp = 0;
  float tmp[64];  // the products of a half
#pragma unroll
  for (int k = 0; k < 64; ++k) tmp[k] = 0.0f;
  for (;;) {
    mbar_wait(&full[s], fp);  // the tile's first stage, with its index
    const int i = tile_ids[s];
    if (i < 0) break;
    const Tile t = tile_of(g, i);
    const bool active = 64 * c < t.rows && g.experiment != 4;  // 4: no products, no epilogue (timing)
    const int xoff = kTileW + (kMode == kBulk ? (t.r0 & 3) : 0);  // the tile's first activation scale
    // Staged epilogue: lane l of the warpgroup's first warp stores rows l and l + 32 of its 64;
    // down: their pairs, loaded now so that the loads' latency hides behind the products.
    int prow[2] = {-1, -1};
    if (kStaged && !kGateUp && w == 0 && active) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int row = 64 * c + lane + 32 * k;
        if (row < t.rows) prow[k] = g.sorted[t.r0 + row];
      }
    }
    float fin[2][64];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int k = 0; k < 64; ++k) fin[h][k] = 0.0f;
    for (int kb = 0; kb < g.nkb; ++kb) {
      if (kb > 0) mbar_wait(&full[s], fp);
      if (active) {
        const float* sc = s_ring + s * kScales;
        const float xs0 = sc[xoff + 64 * c + 16 * w + g8], xs1 = sc[xoff + 64 * c + 16 * w + g8 + 8];
        const uint32_t a_addr = smem_u32(a_ring + s * kABytes + c * kBox);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t w_addr = smem_u32(w_ring + s * kWBytes + h * 2 * kBox);
          wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wgmma_fp8<128>(tmp, make_desc(a_addr + 32 * ks), make_desc(w_addr + 32 * ks), ks);
          wgmma_commit();
          wgmma_wait_all();
          fence_acc(tmp);
          promote<kMode, kBlockW, kGateUp>(fin[h], tmp, sc, h, q, xs0, xs1);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
      if (++s == kStages) s = 0, fp ^= 1;
    }
    if (!active || g.experiment == 7) continue;  // timing experiment 7: products, no epilogue
    // gate_up: where the group scale of tile row `row` goes (k-block-major, or row-major).
    auto act_scale_at = [&](int row) -> float& {
      return g.act_scale[kKmaj ? int64_t(t.col) * g.rows_cap + t.r0 + row
                               : int64_t(t.r0 + row) * ((g.inter + kGroup - 1) / kGroup) + t.col];
    };
    if constexpr (kStaged) {
      // The warpgroup's 64 rows in its half of the staging buffer, then one bulk store a row by
      // the first warp's lanes; the stores run on while the warpgroup goes on to its next tile.
      // Before the buffer is written again, the lanes that stored from it wait until their stores
      // have read it.
      uint8_t* const ob = out_buf + c * 64 * kOut;
      const int wgbar = 1 + c;  // named barrier of this warpgroup's 128 threads
      if (w == 0) bulk_store_wait_read();
      named_sync(wgbar, 128);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int lrow = 16 * w + g8 + 8 * r;
        if constexpr (kGateUp) {
          // The fp8 rows for down: unit u of the tile (0..127) at byte u of the row.
          const int row = 64 * c + lrow;
          float v[2][8][2];
          const float scale = swiglu_row(g, fin, r, q, t.col, v);
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 8; ++j)
              *reinterpret_cast<uint16_t*>(ob + lrow * kOut + 64 * h + 8 * j + 2 * q) =
                  uint16_t(quant(v[h][j][0], scale) | (uint32_t(quant(v[h][j][1], scale)) << 8));
          if (q == 0 && row < t.rows) act_scale_at(row) = scale;
        } else {
          // The bf16 output row: column n of the tile at bytes 2 n.
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 16; ++j)
              *reinterpret_cast<uint32_t*>(ob + lrow * kOut + 2 * (128 * h + 8 * j + 2 * q)) =
                  pack_bf16x2(fin[h][4 * j + 2 * r], fin[h][4 * j + 2 * r + 1]);
        }
      }
      fence_proxy_async();  // the rows, to the bulk stores (async proxy)
      named_sync(wgbar, 128);
      if (w == 0) {
        // I and H are multiples of 16: a row's valid part is a multiple of 16 bytes.
        const int n0 = t.col * (kGateUp ? 128 : kTileW);
        const uint32_t bytes = kGateUp ? uint32_t(min(128, g.inter - n0)) : uint32_t(2 * min(kTileW, g.hidden - n0));
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int lrow = lane + 32 * k, row = 64 * c + lrow;
          if (row >= t.rows) continue;
          void* dst = kGateUp ? static_cast<void*>(g.act_q + int64_t(t.r0 + row) * g.ld_act + n0)
                              : static_cast<void*>(g.y + int64_t(prow[k]) * g.hidden + n0);
          bulk_store(dst, ob + lrow * kOut, bytes);
        }
        bulk_store_commit();
      }
    } else {
      // Epilogue, fragments stored directly. Thread rows: 64 c + 16 w + g8 + 8 r; half h, column
      // 8 j + 2 q + ii.
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = 64 * c + 16 * w + g8 + 8 * r;
        if (kGateUp) {
          float v[2][8][2];
          const float scale = swiglu_row(g, fin, r, q, t.col, v);
          if (row < t.rows) {
            uint8_t* dst = g.act_q + int64_t(t.r0 + row) * g.ld_act;
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int j = 0; j < 8; ++j) {
                const int unit = t.col * 128 + 64 * h + 8 * j + 2 * q;  // I % 16 == 0: unit + 1 < I too
                if (unit < g.inter)
                  *reinterpret_cast<uint16_t*>(dst + unit) =
                      uint16_t(quant(v[h][j][0], scale) | (uint32_t(quant(v[h][j][1], scale)) << 8));
              }
            if (q == 0) act_scale_at(row) = scale;
          }
        } else if (row < t.rows) {
          uint16_t* dst = g.y + int64_t(g.sorted[t.r0 + row]) * g.hidden;
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              const int n = t.col * kTileW + 128 * h + 8 * j + 2 * q;  // H % 16 == 0: n + 1 < H too
              if (n < g.hidden)
                *reinterpret_cast<uint32_t*>(dst + n) = pack_bf16x2(fin[h][4 * j + 2 * r], fin[h][4 * j + 2 * r + 1]);
            }
        }
      }
    }
  }
  if (kStaged && w == 0) bulk_store_wait_all();  // the last tile's stores
}

}  // namespace

namespace {
template <bool kGateUp, int kMode, class Maps, bool kBlockW = false, bool kStaged = false>
void launch_one(const CUtensorMap& amap, const GemmArgs& g, const Maps& maps, int grid, cudaStream_t st) {
  constexpr size_t bytes = smem_bytes(kGateUp, kStaged);
  set_smem(tile_kernel<kGateUp, kMode, Maps, kBlockW, kStaged>, bytes);
  tile_kernel<kGateUp, kMode, Maps, kBlockW, kStaged><<<grid, kThreads, bytes, st>>>(amap, g, maps);
  SIEVE_LAUNCH_CHECK(kGateUp ? "moe_experts fp8 (gate_up tiles)" : "moe_experts fp8 (down tiles)");
}
// Bulk scales, with block weight multipliers (block_w) or one a column, the epilogue staged
// (g.staged_out) or not.
template <bool kGateUp, class Maps>
void launch_bulk(const CUtensorMap& amap, const GemmArgs& g, const Maps& maps, int grid, bool block_w,
                 cudaStream_t st) {
  if (block_w && g.staged_out) {
    launch_one<kGateUp, kBulk, Maps, true, true>(amap, g, maps, grid, st);
  } else if (block_w) {
    launch_one<kGateUp, kBulk, Maps, true, false>(amap, g, maps, grid, st);
  } else if (g.staged_out) {
    launch_one<kGateUp, kBulk, Maps, false, true>(amap, g, maps, grid, st);
  } else {
    launch_one<kGateUp, kBulk, Maps, false, false>(amap, g, maps, grid, st);
  }
}
template <bool kGateUp>
void launch_product(const CUtensorMap& amap, const GemmArgs& g, int grid, cudaStream_t st, TileScales scales,
                    const TileMaps* maps, bool block_w) {
  if (scales == TileScales::kBulk) {
    if (maps) {
      launch_bulk<kGateUp>(amap, g, *maps, grid, block_w, st);
    } else {
      launch_bulk<kGateUp>(amap, g, NoMaps{}, grid, block_w, st);
    }
  } else if (scales == TileScales::kKmajor) {
    if (maps) {
      launch_one<kGateUp, kKmajor>(amap, g, *maps, grid, st);
    } else {
      launch_one<kGateUp, kKmajor>(amap, g, NoMaps{}, grid, st);
    }
  } else {
    launch_one<kGateUp, kRowMajor>(amap, g, NoMaps{}, grid, st);
  }
}
}  // namespace

void launch_tiles(bool gate_up, const CUtensorMap& amap, const GemmArgs& g, int grid, cudaStream_t st,
                  TileScales scales, const TileMaps* maps, bool block_w) {
  SIEVE_CHECK(!maps || scales != TileScales::kRowMajor, "moe_experts fp8: parameter maps need k-block-major scales");
  SIEVE_CHECK(scales != TileScales::kBulk || g.rows_cap % 4 == 0, "moe_experts fp8: bulk scales need rows_cap % 4");
  SIEVE_CHECK(!g.wtiled || scales != TileScales::kRowMajor,
              "moe_experts fp8: tiled weight scales need a k-block-major tile mode");
  if (gate_up) {
    launch_product<true>(amap, g, grid, st, scales, maps, block_w);
  } else {
    launch_product<false>(amap, g, grid, st, scales, maps, block_w);
  }
}

}  // namespace sieve::cuda::moe_fp8
