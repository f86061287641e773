// FP8 MoE, tile kernels (prefill batches; docs/kernels.md "FP8 MoE"): per expert, tiles of 128
// sorted rows x 256 weight rows, k in blocks of 128, on fp8 wgmma with fp32 accumulation.
//
// A persistent CTA of three warpgroups takes tiles i = blockIdx.x, + gridDim.x, ... in the order
// expert, weight-row tile, row tile (row tiles fastest: the CTAs that share an expert's weight
// tile run together and meet in L2):
//  - warpgroup 0, warp 0: the producer. Lane 0 issues the TMA loads of a k block into a ring of
//    4 stages (the 128 activation rows as two 64-row boxes, the 256 weight rows as four) and the
//    stage's 256 weight-row scales and 128 activation-row scales: by default (the weights' tiled
//    scales, [rbs][nkb][256] in the tile's row order, their own or the call's copy of row-major
//    ones, and k-block-major activation scales) as 2 bulk copies counted in the stage's bytes (1
//    arrival: the weight rows' 1 KB run and the activation rows' from the 16-byte boundary at or
//    before the tile's first row), else by 4-byte cp.async from the 32 lanes, each arriving when
//    its copies land (33 arrivals and the TMA bytes). The weight maps come from the kernel
//    parameter (host-encoded) or from global memory (the sort's).
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
// Registers: the final accumulators of a thread are 64 rows x 256 columns / 128 threads = 128
// fp32, the temporary 64 more; the consumer warpgroups raise their limit to 232 (setmaxnreg).
//
// In clusters of two CTAs (MoeTuning::fp8_tile_cluster = 2; bulk scales only): a persistent CTA
// stays on one weight tile only as long as the CTAs with the expert's other row tiles happen to
// run beside it, and drifting CTAs each stream the tile from DRAM again. A cluster's work items
// are (expert, weight-row tile, pair of row tiles) (moe_fp8_work.h block_pairs), i = cluster id,
// + clusters, ...; CTA rank r takes row tile 2 p + r, so both CTAs walk the same k blocks of the
// same weight tile in step. Each stage's four weight boxes are loaded once for the two: rank r
// multicasts boxes 2 r and 2 r + 1 to both CTAs (same shared-memory offsets, completing on each
// CTA's own full[s]), so full[s] expects the CTA's own activation and scale bytes and all 32 KB
// of weights. A stage is reused only once the consumers of both CTAs released it: empty[s] counts
// 16 arrivals, each consumer warp arriving on its own CTA's and on the peer's. A CTA whose row
// tile does not exist (an odd row-tile count) still multicasts its half, loads nothing else, and
// its consumers wait for and release every stage. No CTA leaves while the peer may still write
// its shared memory or arrive on its barriers: every thread of both ends at a cluster barrier
// (and one after the barriers' init orders it before any remote access).
#include <cuda.h>

#include <algorithm>

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
constexpr size_t kSmemBytes =
    1024 + size_t(kStages) * (kABytes + kWBytes) + size_t(kStages) * kScales * 4 + 2 * kStages * 8;

struct Tile {
  int e, col, r0, rows;
};
// Work item i of the CTA (kCluster 1) or of the cluster, whose CTA `rank` takes the pair's row
// tile 2 p + rank (rows <= 0: the pair has no such tile).
template <int kCluster>
__device__ __forceinline__ Tile tile_of(const GemmArgs& g, int64_t i, int rank) {
  const WorkItem w = work_item(kCluster == 1 ? g.blk_start : g.pair_start, g.E, i, g.cols);
  Tile t;
  t.e = w.e;
  t.col = w.col;
  t.r0 = g.offsets[w.e] + (kCluster == 1 ? w.blk : pair_block(w.blk, rank)) * kTileRows;
  t.rows = min(kTileRows, g.offsets[w.e + 1] - t.r0);
  return t;
}

// Clusters: every thread of the cluster through one barrier (release, acquire; threads may reach
// it from different code), the wait of a producer for releases that come from the peer CTA too,
// and a consumer's release of a stage of the peer CTA (addr: shared::cluster, from map_cluster).
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  }
}
__device__ __forceinline__ void mbar_arrive_remote(uint32_t addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(addr) : "memory");
}

template <bool kGateUp>
__device__ __forceinline__ int weight_row(const GemmArgs& g, int col, int c, bool& valid) {
  return kGateUp ? gate_up_row(col, c, g.inter, valid) : down_row(col, c, g.hidden, valid);
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

// kCluster: 1, or 2 (clusters of two CTAs sharing the weight tiles; kBulk only).
template <bool kGateUp, int kMode, class Maps, int kCluster, bool kBlockW>
__global__ void __launch_bounds__(kThreads, 1)
    tile_kernel(const __grid_constant__ CUtensorMap amap, const GemmArgs g, const __grid_constant__ Maps pmaps) {
  static_assert(kCluster == 1 || (kCluster == 2 && kMode == kBulk), "clusters of two: bulk scales only");
  static_assert(!kBlockW || kMode == kBulk, "block weight multipliers: bulk scales only");
  constexpr bool kParamMaps = sizeof(Maps) > sizeof(NoMaps);
  constexpr bool kKmaj = kMode != kRowMajor;
  extern __shared__ uint8_t tile_smem_raw[];
  uint8_t* const smem = align1024(tile_smem_raw);
  uint8_t* const a_ring = smem;
  uint8_t* const w_ring = smem + kStages * kABytes;
  float* const s_ring = reinterpret_cast<float*>(w_ring + kStages * kWBytes);
  uint64_t* const full = reinterpret_cast<uint64_t*>(s_ring + kStages * kScales);
  uint64_t* const empty = full + kStages;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // Clusters of two along x: rank (%cluster_ctarank) = blockIdx.x % 2, cluster id = blockIdx.x / 2
  // (read from blockIdx, which the compiler may read again instead of keeping in registers).
  const int rank = kCluster == 1 ? 0 : int(blockIdx.x & 1);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], kMode == kBulk ? 1 : 33);  // the TMA issuer's expect_tx (and the 32 scale lanes)
      mbar_init(&empty[s], 8 * kCluster);  // the 8 consumer warps (of each CTA of the cluster)
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (kCluster == 1) {
    __syncthreads();
  } else {
    cluster_barrier();  // both CTAs' barriers initialised before any multicast or remote arrival
  }
  const int64_t total = int64_t(kCluster == 1 ? g.blk_start[g.E] : g.pair_start[g.E]) * g.cols;
  const int64_t first = int64_t(blockIdx.x / kCluster), step = int64_t(gridDim.x / kCluster);

  if (warp < 4) {
    regs_dec<40>();
    if (warp != 0) {
      if (kCluster > 1) cluster_barrier();
      return;
    }
    // Producer.
    int s = 0;
    uint32_t ep = 1;
    const CUtensorMap* acquired = nullptr;
    for (int64_t i = first; i < total; i += step) {
      const Tile t = tile_of<kCluster>(g, i, rank);
      const bool has_rows = kCluster == 1 || t.rows > 0;  // clusters: else the weight multicast alone
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
        if (kCluster == 1) {
          mbar_wait(&empty[s], ep);
        } else {
          mbar_wait_cluster(&empty[s], ep);  // released by both CTAs' consumers
        }
        float* sc = s_ring + s * kScales;
        if (kCluster > 1 && !has_rows) {
          if (lane == 0) mbar_expect_tx(&full[s], kWBytes);  // both halves of the weight tile
        } else if (kMode == kBulk && lane == 0) {
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
          if (has_rows) {
            tma_load(a, &amap, kb * kBK, ar0, &full[s]);
            tma_load(a + kBox, &amap, kb * kBK, ar0 + 64, &full[s]);
          }
          uint8_t* w = w_ring + s * kWBytes;
          if (kCluster == 1) {
#pragma unroll
            for (int b = 0; b < 4; ++b) {
              bool unused;
              tma_load(w + b * kBox, wm, kb * kBK, weight_row<kGateUp>(g, t.col, b * 64, unused), &full[s]);
            }
          } else {  // this rank's boxes 2 rank, 2 rank + 1, to both CTAs
            bool unused;
            const int b = 2 * rank;
            tma_load_multicast(w + b * kBox, wm, kb * kBK, weight_row<kGateUp>(g, t.col, b * 64, unused), &full[s],
                               uint16_t(0x3));
            tma_load_multicast(w + (b + 1) * kBox, wm, kb * kBK, weight_row<kGateUp>(g, t.col, b * 64 + 64, unused),
                               &full[s], uint16_t(0x3));
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
    }
    if (kCluster > 1) cluster_barrier();
    return;
  }

  // Consumers.
  regs_inc<232>();
  const int c = (warp >> 2) - 1, w = warp & 3, g8 = lane >> 2, q = lane & 3;
  int s = 0;
  uint32_t fp = 0;
  float tmp[64];
#pragma unroll
  for (int k = 0; k < 64; ++k) tmp[k] = 0.0f;
  for (int64_t i = first; i < total; i += step) {
    const Tile t = tile_of<kCluster>(g, i, rank);
    // clusters: false where the pair has no tile for this CTA; timing experiment 4: no products,
    // no epilogue
    const bool active = 64 * c < t.rows && g.experiment != 4;
    const int xoff = kTileW + (kMode == kBulk ? (t.r0 & 3) : 0);  // the tile's first activation scale
    float fin[2][64];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int k = 0; k < 64; ++k) fin[h][k] = 0.0f;
    for (int kb = 0; kb < g.nkb; ++kb) {
      mbar_wait(&full[s], fp);
      if (active) {
        const float* sc = s_ring + s * kScales;
        const float xs0 = sc[xoff + 64 * c + 16 * w + g8], xs1 = sc[xoff + 64 * c + 16 * w + g8 + 8];
        const uint32_t a_addr = smem_u32(a_ring + s * kABytes + c * kBox);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t w_addr = smem_u32(w_ring + s * kWBytes + h * 2 * kBox);
          wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) wgmma_fp8<128>(tmp, make_desc(a_addr + 32 * ks), make_desc(w_addr + 32 * ks), ks);
          wgmma_commit();
          wgmma_wait_all();
          fence_acc(tmp);
          if (kBlockW) {
            // Weight blocks of 128 rows or more (HF fp8, --quantization fp8): one multiplier for
            // the half's gate rows and one for its up rows (down: one for the half), the same
            // values as the per-column path, and the same products.
            const float wg = sc[h * 128], wu = kGateUp ? sc[h * 128 + 64] : wg;
            const float p[2][2] = {{xs0 * wg, xs1 * wg}, {xs0 * wu, xs1 * wu}};
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
              for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int ii = 0; ii < 2; ++ii) {
                  const int k = 4 * j + 2 * r + ii;
                  fin[h][k] = fmaf(tmp[k], p[j >= 8][r], fin[h][k]);
                }
            continue;
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
                  fin[h][k] = fmaf(tmp[k], (r ? xs1 : xs0) * wv[2 * jj + ii], fin[h][k]);
                }
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(&empty[s]);
        if (kCluster > 1) mbar_arrive_remote(map_cluster(smem_u32(&empty[s]), uint32_t(rank ^ 1)));  // the peer's
      }
      if (++s == kStages) s = 0, fp ^= 1;
    }
    if (!active || g.experiment == 7) continue;  // timing experiment 7: products, no epilogue

    // Epilogue. Thread rows: 64 c + 16 w + g8 + 8 r; half h, column 8 j + 2 q + ii.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 64 * c + 16 * w + g8 + 8 * r;
      if (kGateUp) {
        float v[2][8][2];
        float amax = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int ii = 0; ii < 2; ++ii) {
              const int unit = t.col * 128 + 64 * h + 8 * j + 2 * q + ii;
              const float x = swiglu_oai_value(fin[h][4 * j + 2 * r + ii], fin[h][4 * (j + 8) + 2 * r + ii], g.alpha,
                                               g.limit, g.beta);
              v[h][j][ii] = unit < g.inter ? x : 0.0f;
              amax = fmaxf(amax, fabsf(v[h][j][ii]));
            }
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float scale = group_scale(amax);
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
          if (q == 0)
            g.act_scale[kKmaj ? int64_t(t.col) * g.rows_cap + t.r0 + row
                                : int64_t(t.r0 + row) * ((g.inter + kGroup - 1) / kGroup) + t.col] = scale;
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
  if (kCluster > 1) cluster_barrier();
}

}  // namespace

size_t tile_smem_bytes() { return kSmemBytes; }

namespace {
template <bool kGateUp, int kMode, class Maps, int kCluster = 1, bool kBlockW = false>
void launch_one(const CUtensorMap& amap, const GemmArgs& g, const Maps& maps, int grid, cudaStream_t st) {
  const char* what = kGateUp ? "moe_experts fp8 (gate_up tiles)" : "moe_experts fp8 (down tiles)";
  auto* kernel = tile_kernel<kGateUp, kMode, Maps, kCluster, kBlockW>;
  set_smem(kernel, kSmemBytes);
  if (kCluster == 1) {
    kernel<<<grid, kThreads, kSmemBytes, st>>>(amap, g, maps);
    SIEVE_LAUNCH_CHECK(what);
  } else {
    ClusterLaunch l(dim3(unsigned(grid), 1, 1), dim3(kThreads, 1, 1), kSmemBytes, st, kCluster);
    cuda_check(cudaLaunchKernelEx(&l.cfg, kernel, amap, g, maps), what);
  }
}
// Bulk scales: in clusters of two where asked (cluster_items > 0) and the device keeps such
// clusters resident (asked once a kernel), persistent: at most that many clusters.
template <bool kGateUp, class Maps, bool kBlockW>
void launch_bulk(const CUtensorMap& amap, const GemmArgs& g, const Maps& maps, int grid, int64_t cluster_items,
                 cudaStream_t st) {
  if (cluster_items > 0) {
    static const int resident = resident_clusters(tile_kernel<kGateUp, kBulk, Maps, 2, kBlockW>, kThreads, kSmemBytes,
                                                  2, std::max(1, num_sms() / 2), 0);
    if (resident > 0) {
      launch_one<kGateUp, kBulk, Maps, 2, kBlockW>(amap, g, maps, int(2 * std::min<int64_t>(cluster_items, resident)),
                                                   st);
      return;
    }
  }
  launch_one<kGateUp, kBulk, Maps, 1, kBlockW>(amap, g, maps, grid, st);
}
template <bool kGateUp, class Maps>
void launch_bulk(const CUtensorMap& amap, const GemmArgs& g, const Maps& maps, int grid, int64_t cluster_items,
                 bool block_w, cudaStream_t st) {
  if (block_w) {
    launch_bulk<kGateUp, Maps, true>(amap, g, maps, grid, cluster_items, st);
  } else {
    launch_bulk<kGateUp, Maps, false>(amap, g, maps, grid, cluster_items, st);
  }
}
template <bool kGateUp>
void launch_product(const CUtensorMap& amap, const GemmArgs& g, int grid, cudaStream_t st, TileScales scales,
                    const TileMaps* maps, int64_t cluster_items, bool block_w) {
  if (scales == TileScales::kBulk) {
    if (maps) {
      launch_bulk<kGateUp>(amap, g, *maps, grid, cluster_items, block_w, st);
    } else {
      launch_bulk<kGateUp>(amap, g, NoMaps{}, grid, cluster_items, block_w, st);
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
                  TileScales scales, const TileMaps* maps, int64_t cluster_items, bool block_w) {
  SIEVE_CHECK(!maps || scales != TileScales::kRowMajor, "moe_experts fp8: parameter maps need k-block-major scales");
  SIEVE_CHECK(scales != TileScales::kBulk || g.rows_cap % 4 == 0, "moe_experts fp8: bulk scales need rows_cap % 4");
  SIEVE_CHECK(!g.wtiled || scales != TileScales::kRowMajor,
              "moe_experts fp8: tiled weight scales need a k-block-major tile mode");
  SIEVE_CHECK(cluster_items <= 0 || (scales == TileScales::kBulk && g.pair_start),
              "moe_experts fp8: tile clusters need bulk scales and the sort's pair prefix");
  if (gate_up) {
    launch_product<true>(amap, g, grid, st, scales, maps, cluster_items, block_w);
  } else {
    launch_product<false>(amap, g, grid, st, scales, maps, cluster_items, block_w);
  }
}

}  // namespace sieve::cuda::moe_fp8
