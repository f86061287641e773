// ops::linear on CUDA. BF16 / F32 weights go to matmul (cuBLAS). FP8 weights ((1, 128) or
// (128, 128) scale blocks; docs/kernels.md "FP8 GEMM" has the design and which path each shape
// takes):
//   - prefill (m > 64): cuBLASLt block scaling where the weight's scales allow it
//     (linear_cublaslt.cu: 128 x 128 blocks whose rows of blocks are a multiple of 4 long, or any
//     FP8 weight that carries cuBLASLt's copy of its scales, WeightView::scale_lt), x quantized
//     per 1 x 128 group first with k-block-major scales; else the wgmma kernel below;
//   - decode (m <= 64) and the rest: one wgmma kernel (linear_fp8_plan.h has its index
//     arithmetic):
//   - a CTA = 1 or 2 consumer warpgroups (64 weight rows each, wgmma m64nBNk32 e4m3 with fp32
//     accumulators, the weight tile as the M side so that a few tokens still fill the N side)
//     and one producer warp (streams weight and token tiles of 128 k by 2-D tensor copies into a
//     ring of shared-memory stages, and each stage's scales by cp.async);
//   - F32 / BF16 x: a quantize kernel writes them to a private buffer first (by default; up to
//     LinearTuning::fuse_quant_max_m tokens the CTA quantizes its own k range of the rows into
//     the stages itself instead: first stages by every warp, later ones by the producer);
//   - each 128-k block is accumulated alone (4 wgmma), then promoted into the fp32 running sum
//     times w_scale * x_scale (the tensor cores' fp8 sums are truncated to 13 bits per step,
//     tests/kernels/fp8_mma_model.h);
//   - split-K CTAs of a tile form a cluster; each stages its partial tile in shared memory and
//     the cluster sums them in rank order through distributed shared memory (deterministic, no
//     global partials), each CTA storing a slice of y (accumulate: y += once, then rounded);
//   - at decode the kernel (and its quantizer) are launched with programmatic dependent launch:
//     the weights of the first stages load before griddepcontrol.wait, x and everything written
//     after it (so the kernel before must not write the weights: they are written at load only).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/quant.h"
#include "kernels/cuda/wgmma.cuh"

namespace sieve::cuda {

namespace {

struct GemmArgs {
  const float* x_scale;  // FP8 rows: [m][kb_total]
  const void* x;         // F32 / BF16 rows the kernel quantizes itself (x_kind 1, 2)
  int64_t ldx;
  int x_kind;  // 0: FP8 rows by tensor copy; 1 + ElemCode (F32, BF16): rows quantized here
  int x_vec;   // x rows take 4-element vector loads
  int k;
  const float* w_scale;  // [ceil(n / br)][kb_total]
  int br;                // weight scale block rows: 1 or 128
  int m, n;
  void* y;
  int64_t ldy;
  int y_bf16;
  int accumulate;
  int l2_first;  // weight tiles with the L2 evict-first policy (each is read once)
  fp8::Plan plan;
};

// Warp: token row r of the tile (token t0 + r) at k block kb quantized into a stage's token tile
// (the codes where the 128-byte-swizzled tensor copy would put them) and its scale into xs[r];
// rows past m become zero codes. Bit for bit quant.cu's quantizer. `v` holds the lane's values,
// loaded by load_token_row.
__device__ __forceinline__ void load_token_row(const GemmArgs& a, int tok, int kb, int lane,
                                               float (&v)[4], int& valid) {
  const int c0 = kb * fp8::kBK + lane * 4;
  valid = tok < a.m ? max(0, min(4, a.k - c0)) : 0;
  if (tok < a.m) {
    load_act4(a.x, a.x_kind - 1, int64_t(tok) * a.ldx + c0, valid, a.x_vec != 0, v);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = 0.0f;
  }
}
__device__ __forceinline__ void store_token_row(const GemmArgs& a, int tok, int r,
                                                const float (&v)[4], int valid, uint8_t* tile,
                                                float* xs, int lane) {
  uint8_t q[4] = {0, 0, 0, 0};
  float sc = 1.0f;
  if (tok < a.m) sc = quantize_group_warp(v, valid, q);
  *reinterpret_cast<uint32_t*>(tile + fp8::x_tile_offset(r, lane * 4)) =
      uint32_t(q[0]) | (uint32_t(q[1]) << 8) | (uint32_t(q[2]) << 16) | (uint32_t(q[3]) << 24);
  if (lane == 0) xs[r] = sc;
}
// Warp: the pairs (stage, token row) j = first, first + step, ... < count (rows a stage: bn) of
// stages i0 + j / bn (ring slot (i0 + j / bn) % stages, k block kb0 + i0 + j / bn), four rows'
// loads in flight at a time.
__device__ __forceinline__ void quantize_token_rows(const GemmArgs& a, uint8_t* base,
                                                    const fp8::SmemLayout& L, int t0, int kb0,
                                                    int i0, int first, int step, int count,
                                                    int lane) {
  const int bn = a.plan.bn;
  for (int j0 = first; j0 < count; j0 += 4 * step) {
    float v[4][4];
    int valid[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + u * step;
      if (j < count) load_token_row(a, t0 + j % bn, kb0 + i0 + j / bn, lane, v[u], valid[u]);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + u * step;
      if (j >= count) break;
      const int s = (i0 + j / bn) % a.plan.stages, r = j % bn;
      uint8_t* tile = base + L.tiles + s * L.stage_bytes + L.w_tile;
      float* xs = reinterpret_cast<float*>(base + L.scales + s * L.scale_stage);
      store_token_row(a, t0 + r, r, v[u], valid[u], tile, xs, lane);
    }
  }
}

template <int WGS, int BN>
__global__ void __launch_bounds__(128 * WGS + 32, 1)
    linear_fp8_kernel(const __grid_constant__ CUtensorMap wmap,
                      const __grid_constant__ CUtensorMap xmap, const GemmArgs a) {
  constexpr int BM = fp8::kWgRows * WGS;
  constexpr int kAll = 128 * WGS + 32;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const fp8::Plan& p = a.plan;
  const fp8::SmemLayout L = fp8::smem_layout(p);
  uint64_t* full = reinterpret_cast<uint64_t*>(base);
  uint64_t* empty = full + p.stages;
  int tile_n, tile_m, split;
  fp8::cta_tile(p, blockIdx.x, blockIdx.y, tile_n, tile_m, split);
  const int n0 = tile_n * BM, t0 = tile_m * BN;
  const int kb0 = fp8::split_kb(p, split), nkb = fp8::split_kb(p, split + 1) - kb0;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const bool producer = wg == WGS;
  const bool fused = a.x_kind != 0;
  const int pre = min(nkb, p.stages);  // stages whose weights load before the wait
  float* staged = reinterpret_cast<float*>(base + L.tiles);  // reuses the ring once it is drained
  constexpr int P = BM + 4;                                  // fp8::stage_pitch

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], 33);  // 32 cp.async arrivals + the producer's lane 0
      mbar_init(&empty[s], 4 * WGS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    prefetch_tensor_map(&wmap);
    if (!fused) prefetch_tensor_map(&xmap);
  }
  __syncthreads();
  // Programmatic dependent launch: the next kernel may start (it waits for this one before it
  // reads y); this one reads only its weights before pdl_wait. Plain launches: no-ops.
  pdl_trigger();

  // The producer's parts of stage i: the weight tile and weight scales (the stage expects all
  // its tensor-copy bytes); FP8 rows: the token tile and token scales; the arrivals once the
  // stage is written (its cp.asyncs when they land, lane 0 after the warp's stores).
  const uint64_t policy = producer && a.l2_first ? l2_policy_evict_first() : 0;
  auto load_weights = [&](int i) {
    const int s = i % p.stages, kb = kb0 + i;
    if (lane == 0) {
      uint8_t* st = base + L.tiles + s * L.stage_bytes;
      mbar_expect_tx_only(&full[s], uint32_t(fused ? L.w_tile : L.stage_bytes));
      if (a.l2_first)
        tma_load_2d_hint(st, &wmap, kb * fp8::kBK, n0, &full[s], policy);
      else
        tma_load_2d(st, &wmap, kb * fp8::kBK, n0, &full[s]);
    }
    float* ws = reinterpret_cast<float*>(base + L.scales + s * L.scale_stage) + BN;
    // Rows past n read a real scale (of the last row): their tiles are zeros.
    for (int r = lane; r < BM; r += 32)
      cp_async4(ws + r, a.w_scale + fp8::w_scale_index(min(n0 + r, a.n - 1), a.br, p.kb_total, kb));
  };
  auto load_tokens = [&](int i) {
    const int s = i % p.stages, kb = kb0 + i;
    if (lane == 0)
      tma_load_2d(base + L.tiles + s * L.stage_bytes + L.w_tile, &xmap, kb * fp8::kBK, t0,
                  &full[s]);
    float* xs = reinterpret_cast<float*>(base + L.scales + s * L.scale_stage);
    // Rows past m read a real scale (of the last row): their tiles are zeros.
    for (int j = lane; j < BN; j += 32)
      cp_async4(xs + j, a.x_scale + int64_t(min(t0 + j, a.m - 1)) * p.kb_total + kb);
  };
  auto arrive = [&](int i) {
    cp_async_arrive_noinc(&full[i % p.stages]);
    __syncwarp();
    if (lane == 0) mbar_arrive(&full[i % p.stages]);
  };

  if (producer) {
    for (int i = 0; i < pre; ++i) load_weights(i);
    pdl_wait();
    if (!fused)
      for (int i = 0; i < pre; ++i) {
        load_tokens(i);
        arrive(i);
      }
  } else {
    pdl_wait();
  }
  if (fused) {
    // Every warp quantizes token rows of the first stages; then the producer signals them.
    quantize_token_rows(a, base, L, t0, kb0, 0, threadIdx.x >> 5, kAll / 32, pre * BN, lane);
    fence_proxy_async();
    named_bar_sync(2, kAll);
    if (producer)
      for (int i = 0; i < pre; ++i) arrive(i);
  }

  if (producer) {
    const int rows = min(BN, a.m - t0);  // rows past m keep the zeros of the first pass
    for (int i = pre; i < nkb; ++i) {
      const int s = i % p.stages;
      mbar_wait(&empty[s], uint32_t((i / p.stages) - 1) & 1u);
      load_weights(i);
      if (fused) {
        quantize_token_rows(a, base, L, t0, kb0, i, 0, 1, rows, lane);
        fence_proxy_async();
      } else {
        load_tokens(i);
      }
      arrive(i);
    }
  } else {
    const int cwg = wg;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    const int row0 = fp8::acc_row(cwg, warp, lane, 0), row1 = fp8::acc_row(cwg, warp, lane, 2);
    for (int i = 0; i < nkb; ++i) {
      const int s = i % p.stages;
      mbar_wait(&full[s], uint32_t(i / p.stages) & 1u);
      const uint8_t* st = base + L.tiles + s * L.stage_bytes;
      const uint64_t da = make_desc(smem_u32(st + cwg * fp8::kWgRows * fp8::kBK));
      const uint64_t db = make_desc(smem_u32(st + L.w_tile));
      float blk[BN / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < fp8::kBK / 32; ++kk)
        WgmmaFp8<BN>::mma(blk, desc_add(da, kk * 32), desc_add(db, kk * 32), kk);
      wgmma_commit();
      wgmma_wait_all();
      fence_acc(blk);
      const float* xs = reinterpret_cast<const float*>(base + L.scales + s * L.scale_stage);
      fp8::promote_block<BN>(acc, blk, xs, xs[BN + row0], xs[BN + row1], lane);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
    named_bar_sync(1, 128 * WGS);  // every consumer is done with the ring
#pragma unroll
    for (int i = 0; i < BN / 2; ++i)
      staged[fp8::acc_col(lane, i) * P + fp8::acc_row(cwg, warp, lane, i)] = acc[i];
  }

  const int splits = p.splits;
  if (splits > 1)
    cluster_sync_all();
  else
    __syncthreads();
  if (!producer) {
    int e0, e1;
    fp8::reduce_slice(BM, BN, splits, splits > 1 ? int(cluster_rank()) : 0, e0, e1);
    for (int e = e0 + 4 * int(threadIdx.x); e < e1; e += 4 * 128 * WGS) {
      const int token = e / BM, row = e % BM;
      const float* src = staged + token * P + row;
      float4 v;
      if (splits == 1) {
        v = *reinterpret_cast<const float4*>(src);
      } else {
        const uint32_t addr = smem_u32(src);
        v = ld_cluster_f4(map_cluster(addr, 0));
        for (int q = 1; q < splits; ++q) {
          const float4 u = ld_cluster_f4(map_cluster(addr, uint32_t(q)));
          v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
        }
      }
      const int tok = t0 + token;
      if (tok >= a.m) continue;
      const float vals[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = n0 + row + c;
        if (col >= a.n) break;
        const int64_t o = int64_t(tok) * a.ldy + col;
        if (a.y_bf16) {
          uint16_t* y = static_cast<uint16_t*>(a.y);
          y[o] = f32_to_bf16_bits(a.accumulate ? bf16_to_f32(y[o]) + vals[c] : vals[c]);
        } else {
          float* y = static_cast<float*>(a.y);
          y[o] = a.accumulate ? y[o] + vals[c] : vals[c];
        }
      }
    }
  }
  if (splits > 1) cluster_sync_all();  // no CTA leaves while another reads its shared memory
}

using KernelFn = void (*)(const CUtensorMap, const CUtensorMap, const GemmArgs);

template <int WGS>
KernelFn kernel_for_bn(int bn) {
  switch (bn) {
    case 8:
      return linear_fp8_kernel<WGS, 8>;
    case 16:
      return linear_fp8_kernel<WGS, 16>;
    case 32:
      return linear_fp8_kernel<WGS, 32>;
    case 64:
      return linear_fp8_kernel<WGS, 64>;
    case 128:
      return linear_fp8_kernel<WGS, 128>;
    default:
      return nullptr;
  }
}
KernelFn kernel_for(const fp8::Plan& p) {
  return p.wgs == 2 ? kernel_for_bn<2>(p.bn) : kernel_for_bn<1>(p.bn);
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

constexpr int kMaxSmem = 227 * 1024;

// Clusters of plan p's kernel resident at once on this device (kept per kernel, ring depth and
// cluster size).
int64_t resident_tiles(const fp8::Plan& p) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int, int>, int> seen;
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  const auto key = std::make_tuple(dev, p.wgs, p.bn, p.stages, p.splits);
  std::lock_guard<std::mutex> lock(mu);
  auto it = seen.find(key);
  if (it == seen.end()) {
    const int64_t tiles = int64_t(p.tiles_n) * p.tiles_m;
    it = seen.emplace(key,
                      resident_clusters(kernel_for(p), p.threads(), size_t(fp8::smem_request(p)),
                                        p.splits, int(std::min<int64_t>(tiles, 4096)), INT_MAX))
             .first;
  }
  return it->second;
}

using fp8::ceil_div;

// Where the GEMM takes its rows: FP8 codes [m][k] (row stride ldq bytes, 16-byte aligned) with
// scales xs [m][kb_total]; or F32 / BF16 rows it quantizes itself (x_kind 1 + ElemCode).
struct TokenRows {
  const uint8_t* q = nullptr;
  int64_t ldq = 0;
  const float* xs = nullptr;
  int x_kind = 0;
};

void launch_fp8_gemm(const ops::LinearParams& p, const TokenRows& x, bool pdl, cudaStream_t st) {
  const int64_t m = p.m, n = p.w.rows, k = p.w.cols;
  const fp8::Plan plan = linear_fp8_plan(m, n, k);
  KernelFn kernel = kernel_for(plan);
  if (!kernel)
    throw Error("linear: no FP8 kernel for " + std::to_string(plan.wgs) + " warpgroups x " +
                std::to_string(plan.bn) + " tokens");
  GemmArgs a{};
  a.x_scale = x.xs;
  a.x = p.x;
  a.ldx = p.ldx;
  a.x_kind = x.x_kind;
  a.x_vec = x.x_kind != 0 && act4_vec(p.x, p.x_dtype, p.ldx);
  a.k = int(k);
  a.w_scale = p.w.scale;
  a.br = p.w.scale_block_rows;
  a.m = int(m);
  a.n = int(n);
  a.y = p.y;
  a.ldy = p.ldy;
  a.y_bf16 = p.y_dtype == DType::BF16;
  a.accumulate = p.accumulate;
  a.l2_first = m <= 64;
  a.plan = plan;
  const CUtensorMap wmap = fp8_tensor_map(p.w.data, n, k, k, plan.bm());
  const CUtensorMap xmap = x.x_kind == 0 ? fp8_tensor_map(x.q, m, k, x.ldq, plan.bn) : wmap;
  const int smem = fp8::smem_request(plan);
  set_smem(kernel, size_t(smem));
  const dim3 grid(unsigned(plan.grid_x()), unsigned(plan.tiles_m)), block(unsigned(plan.threads()));
  if (plan.splits > 1) {
    ClusterLaunch l(grid, block, size_t(smem), st, plan.splits);
    if (pdl) l.allow_programmatic_serialization();
    cuda_check(cudaLaunchKernelEx(&l.cfg, kernel, wmap, xmap, a), "linear (fp8) launch");
  } else {
    launch_pdl(pdl, kernel, grid, block, size_t(smem), st, "linear (fp8) launch", wmap, xmap, a);
  }
}

// y = x . w^T through matmul (cuBLAS) for F32 / BF16 weights.
bool run_linear_plain(const ops::LinearParams& p, void* stream) {
  if (p.x_dtype == DType::FP8_E4M3) return false;
  ops::MatmulParams mm;
  mm.x = p.x;
  mm.x_dtype = p.x_dtype;
  mm.w = p.w.data;
  mm.w_dtype = p.w.dtype;
  mm.y = p.y;
  mm.y_dtype = p.y_dtype;
  mm.m = p.m;
  mm.n = p.w.rows;
  mm.k = p.w.cols;
  mm.ldx = p.ldx;
  mm.ldy = p.ldy;
  mm.accumulate = p.accumulate;
  return run_matmul(mm, stream);
}

// The cuBLASLt block-scaled GEMM of an FP8 weight, or kTensor (none) where its scales do not
// allow one: (128, 128) blocks by BLK128x128 (their own scales when the rows of blocks are a
// multiple of 4 long, else scale_lt), (1, 128) by VEC128 with scale_lt (k-block-major).
LtGemm lt_gemm_for(const ops::LinearParams& p) {
  LtGemm g;
  g.scaling = LtScaling::kTensor;
  const int64_t kb = ceil_div(p.w.cols, 128);
  if (p.w.scale_block_cols != 128) return g;
  if (p.w.scale_block_rows == 128 && (kb % 4 == 0 || p.w.scale_lt)) {
    g.scaling = LtScaling::kBlock;
    g.w_scale = kb % 4 == 0 ? p.w.scale : p.w.scale_lt;
  } else if (p.w.scale_block_rows == 1 && p.w.scale_lt) {
    g.scaling = LtScaling::kVec128;
    g.w_scale = p.w.scale_lt;
  } else {
    return g;
  }
  g.w = p.w.data;
  g.y = p.y;
  g.y_dtype = p.y_dtype;
  g.ldy = p.ldy;
  g.m = p.m;
  g.n = p.w.rows;
  g.k = p.w.cols;
  g.accumulate = p.accumulate;
  return g;
}

// FP8 rows the GEMMs take as they are (16-byte aligned rows); others go through a private buffer
// with rows of round_up(k, 16) bytes.
bool fp8_rows_ready(const ops::LinearParams& p) {
  return p.x_dtype == DType::FP8_E4M3 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
         p.ldx % 16 == 0;
}
int64_t token_row_bytes(const ops::LinearParams& p) {
  return fp8_rows_ready(p) ? p.ldx : ceil_div(p.w.cols, 16) * 16;
}

}  // namespace

CUtensorMap fp8_tensor_map(const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
  auto fn = encode_fn();
  if (!fn) throw Error("linear: the driver has no cuTensorMapEncodeTiled");
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld)};
  const cuuint32_t box[2] = {cuuint32_t(fp8::kBK), cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r =
      fn(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, estr,
         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("linear: cannot describe an fp8 matrix of " + std::to_string(rows) + " x " +
                std::to_string(cols) + " (row stride " + std::to_string(ld) +
                ") for the tensor copy engine (error " + std::to_string(int(r)) + ")");
  return map;
}

fp8::Plan linear_fp8_plan(int64_t m, int64_t n, int64_t k) {
  const LinearTuning& t = tuning().linear;
  fp8::Plan p = fp8::make_plan(m, n, k, num_sms(), kMaxSmem, t);
  // The split rule counts CTA slots, but a cluster must fit in one GPC: with the rule's split
  // count, fewer splits while the tiles' clusters would not all be resident at once (a second
  // wave of clusters would double the time).
  if (t.splits == 0)
    while (p.splits > 1 && int64_t(p.tiles_n) * p.tiles_m > resident_tiles(p)) --p.splits;
  return p;
}

LinearPath linear_path(const ops::LinearParams& p) {
  const LinearTuning& t = tuning().linear;
  if (p.w.dtype != DType::FP8_E4M3) return LinearPath::kMatmul;
  // Auto: cuBLASLt at prefill for weights of whole 16-row groups (the shapes its block-scaled
  // layouts were checked at; the model's are whole 128-row blocks).
  if (t.backend == 2 || (t.backend == 0 && p.m > 64 && p.w.rows % 16 == 0)) {
    LtGemm g = lt_gemm_for(p);
    if (g.scaling != LtScaling::kTensor) {
      g.ldx = token_row_bytes(p);
      g.x_scale = g.w_scale;  // present (the heuristic looks at that); not read
      if (cublaslt_fp8_accepts(g))
        return g.scaling == LtScaling::kBlock ? LinearPath::kLtBlock : LinearPath::kLtVec128;
    }
    if (t.backend == 2) return LinearPath::kNone;
  }
  if (p.x_dtype != DType::FP8_E4M3 && p.m <= t.fuse_quant_max_m) return LinearPath::kOwnFused;
  return LinearPath::kOwn;
}

bool run_linear(const ops::LinearParams& p, void* stream_v) {
  cpu::validate_linear(p);
  const int64_t m = p.m, n = p.w.rows, k = p.w.cols;
  if (m == 0 || n == 0) return true;
  if (p.w.dtype != DType::FP8_E4M3) return run_linear_plain(p, stream_v);
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);
  const size_t ysz = dtype_size(p.y_dtype);
  if (k == 0) {
    if (!p.accumulate)
      cuda_check(cudaMemset2DAsync(p.y, size_t(p.ldy) * ysz, 0, size_t(n) * ysz, size_t(m), st),
                 "cudaMemset2DAsync (linear, k = 0)");
    return true;
  }
  const bool blocks_ok =
      (p.w.scale_block_rows == 1 || p.w.scale_block_rows == 128) && p.w.scale_block_cols == 128;
  if (!blocks_ok || k % 16 != 0 || reinterpret_cast<uintptr_t>(p.w.data) % 16 != 0) return false;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || p.ldy > INT_MAX) return false;
  const LinearPath path = linear_path(p);
  if (path == LinearPath::kNone) return false;
  const LinearTuning& t = tuning().linear;
  // Decode: the GEMM (and its quantizer) start while the previous kernel finishes (not on the
  // legacy default stream, which orders everything anyway).
  const bool pdl = st != nullptr && t.pdl && m <= 64;
  if (path == LinearPath::kOwnFused) {
    TokenRows x;
    x.x_kind = 1 + elem_code(p.x_dtype);
    launch_fp8_gemm(p, x, pdl, st);
    return true;
  }
  const bool lt = path == LinearPath::kLtBlock || path == LinearPath::kLtVec128;
  const int64_t kb = ceil_div(k, fp8::kBK);
  // x as e4m3 codes with 16-byte aligned rows, and its scales (k-block-major for cuBLASLt).
  TokenRows x;
  x.q = static_cast<const uint8_t*>(p.x);
  x.ldq = p.ldx;
  x.xs = p.x_scale;
  const bool x_ready = fp8_rows_ready(p);
  const int64_t kq = token_row_bytes(p);
  const size_t codes = size_t(m * kq), scales = size_t(m * kb) * sizeof(float);
  uint8_t* scratch = nullptr;
  if (!x_ready || lt)
    scratch = static_cast<uint8_t*>(private_scratch(st, kScratchLinear, codes + 2 * scales + 256));
  float* xs_buf = scratch ? reinterpret_cast<float*>(scratch + codes) : nullptr;
  if (!x_ready) {
    uint8_t* q = scratch;
    if (p.x_dtype == DType::FP8_E4M3) {
      cuda_check(cudaMemcpy2DAsync(q, size_t(kq), p.x, size_t(p.ldx), size_t(k), size_t(m),
                                   cudaMemcpyDeviceToDevice, st),
                 "cudaMemcpy2DAsync (linear, fp8 rows)");
    } else {
      quantize_rows(p.x, p.x_dtype, p.ldx, m, k, q, kq, xs_buf, st, lt, pdl && !lt);
      x.xs = xs_buf;
    }
    x.q = q;
    x.ldq = kq;
  }
  if (lt) {
    LtGemm g = lt_gemm_for(p);
    g.x = x.q;
    g.ldx = x.ldq;
    if (p.x_dtype == DType::FP8_E4M3) {
      transpose_scales(p.x_scale, m, kb, xs_buf, st);
      g.x_scale = xs_buf;
    } else {
      g.x_scale = x.xs;  // the quantizer wrote them k-block-major
    }
    std::string why;
    if (!cublaslt_fp8_gemm(g, st, &why)) throw Error("linear: cuBLASLt FP8 GEMM failed: " + why);
    return true;
  }
  launch_fp8_gemm(p, x, pdl, st);
  return true;
}

}  // namespace sieve::cuda
