// ops::linear on CUDA. BF16 / F32 weights go to matmul (cuBLAS). FP8 weights ((1, 128) or
// (128, 128) scale blocks) run one wgmma kernel for every m (linear_fp8_plan.h has its index
// arithmetic and docs/kernels.md "FP8 GEMM" the design):
//   - x in F32 / BF16 is first quantized per 1 x 128 group into a private buffer (quant.cu);
//   - a CTA = 1 or 2 consumer warpgroups (64 weight rows each, wgmma m64nBNk32 e4m3 with fp32
//     accumulators, the weight tile as the M side so that a few tokens still fill the N side)
//     and one producer warp (streams weight and token tiles of 128 k by 2-D tensor copies into a
//     ring of shared-memory stages, and each stage's scales by cp.async);
//   - each 128-k block is accumulated alone (4 wgmma), then promoted into the fp32 running sum
//     times w_scale * x_scale (the tensor cores' fp8 sums are exact only within a block);
//   - split-K CTAs of a tile form a cluster; each stages its partial tile in shared memory and
//     the cluster sums them in rank order through distributed shared memory (deterministic, no
//     global partials), each CTA storing a slice of y (accumulate: y += once, then rounded).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>

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

std::mutex g_tuning_mu;
LinearTuning g_tuning;

struct GemmArgs {
  const float* x_scale;  // [m][kb_total]
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

template <int WGS, int BN>
__global__ void __launch_bounds__(128 * WGS + 32, 1)
    linear_fp8_kernel(const __grid_constant__ CUtensorMap wmap,
                      const __grid_constant__ CUtensorMap xmap, const GemmArgs a) {
  constexpr int BM = fp8::kWgRows * WGS;
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
  float* staged = reinterpret_cast<float*>(base + L.tiles);  // reuses the ring once it is drained
  constexpr int P = BM + 4;                                  // fp8::stage_pitch

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], 33);  // 32 cp.async arrivals + the expect_tx arrival
      mbar_init(&empty[s], 4 * WGS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    prefetch_tensor_map(&wmap);
    prefetch_tensor_map(&xmap);
  }
  __syncthreads();

  if (producer) {
    const uint64_t policy = a.l2_first ? l2_policy_evict_first() : 0;
    for (int i = 0; i < nkb; ++i) {
      const int s = i % p.stages;
      if (i >= p.stages) mbar_wait(&empty[s], uint32_t((i / p.stages) - 1) & 1u);
      const int kb = kb0 + i;
      float* xs = reinterpret_cast<float*>(base + L.scales + s * L.scale_stage);
      float* ws = xs + BN;
      // Rows past m or n read a real scale (of the last row): their tiles are zeros.
      for (int j = lane; j < BN; j += 32)
        cp_async4(xs + j, a.x_scale + int64_t(min(t0 + j, a.m - 1)) * p.kb_total + kb);
      for (int r = lane; r < BM; r += 32)
        cp_async4(ws + r,
                  a.w_scale + fp8::w_scale_index(min(n0 + r, a.n - 1), a.br, p.kb_total, kb));
      cp_async_arrive_noinc(&full[s]);
      if (lane == 0) {
        uint8_t* st = base + L.tiles + s * L.stage_bytes;
        mbar_expect_tx(&full[s], uint32_t(L.stage_bytes));
        if (a.l2_first)
          tma_load_2d_hint(st, &wmap, kb * fp8::kBK, n0, &full[s], policy);
        else
          tma_load_2d(st, &wmap, kb * fp8::kBK, n0, &full[s]);
        tma_load_2d(st + L.w_tile, &xmap, kb * fp8::kBK, t0, &full[s]);
      }
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

using fp8::ceil_div;

// Launches the FP8 GEMM on quantized rows xq [m][k] (row stride ldq bytes, 16-byte aligned) with
// scales xs [m][kb_total].
void launch_fp8_gemm(const ops::LinearParams& p, const uint8_t* xq, int64_t ldq, const float* xs,
                     cudaStream_t st) {
  const int64_t m = p.m, n = p.w.rows, k = p.w.cols;
  const fp8::Plan plan = linear_fp8_plan(m, n, k);
  KernelFn kernel = kernel_for(plan);
  if (!kernel)
    throw Error("linear: no FP8 kernel for " + std::to_string(plan.wgs) + " warpgroups x " +
                std::to_string(plan.bn) + " tokens");
  GemmArgs a{};
  a.x_scale = xs;
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
  const CUtensorMap xmap = fp8_tensor_map(xq, m, k, ldq, plan.bn);
  const int smem = fp8::smem_request(plan);
  set_smem(kernel, size_t(smem));
  const dim3 grid(unsigned(plan.grid_x()), unsigned(plan.tiles_m)), block(unsigned(plan.threads()));
  if (plan.splits > 1) {
    ClusterLaunch l(grid, block, size_t(smem), st, plan.splits);
    cuda_check(cudaLaunchKernelEx(&l.cfg, kernel, wmap, xmap, a), "linear (fp8) launch");
  } else {
    kernel<<<grid, block, size_t(smem), st>>>(wmap, xmap, a);
    SIEVE_LAUNCH_CHECK("linear (fp8)");
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

// The cuBLASLt block-scaled GEMM (LinearTuning::backend 2): (128, 128) weight scales whose rows
// of blocks are a multiple of 4 long, token scales transposed into the scratch after xq.
bool run_linear_cublaslt(const ops::LinearParams& p, const uint8_t* xq, int64_t ldq,
                         const float* xs, float* xs_t, cudaStream_t st) {
  const int64_t kb = ceil_div(p.w.cols, 128);
  if (p.w.scale_block_rows != 128 || kb % 4 != 0) return false;
  transpose_scales(xs, p.m, kb, xs_t, st);
  LtGemm g;
  g.x = xq;
  g.ldx = ldq;
  g.x_scale = xs_t;
  g.w = p.w.data;
  g.w_scale = p.w.scale;
  g.y = p.y;
  g.y_dtype = p.y_dtype;
  g.ldy = p.ldy;
  g.m = p.m;
  g.n = p.w.rows;
  g.k = p.w.cols;
  g.scaling = LtScaling::kBlock;
  g.accumulate = p.accumulate;
  return cublaslt_fp8_gemm(g, st);
}

}  // namespace

LinearTuning linear_tuning() {
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  return g_tuning;
}
void set_linear_tuning(const LinearTuning& t) {
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  g_tuning = t;
}

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
  return fp8::make_plan(m, n, k, num_sms(), kMaxSmem, linear_tuning());
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
  const int64_t kb = ceil_div(k, fp8::kBK);
  const LinearTuning tuning = linear_tuning();
  // cuBLASLt's block scaling where it is the faster (prefill with 128 x 128 weight blocks, H100:
  // 80-95 % of the FP8 rate) or forced; at decode it is 2.5-4 x the bytes floor and refuses m = 1.
  const bool lt = tuning.backend == 2 ||
                  (tuning.backend == 0 && p.w.scale_block_rows == 128 && m > 64 && kb % 4 == 0);
  // x as e4m3 codes with 16-byte aligned rows, and its scales.
  const uint8_t* xq = static_cast<const uint8_t*>(p.x);
  int64_t ldq = p.ldx;
  const float* xs = p.x_scale;
  const bool x_ready =
      p.x_dtype == DType::FP8_E4M3 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.ldx % 16 == 0;
  const int64_t kq = ceil_div(k, 16) * 16;
  const size_t codes = size_t(m * kq), scales = size_t(m * kb) * sizeof(float);
  uint8_t* scratch = nullptr;
  if (!x_ready || lt)
    scratch = static_cast<uint8_t*>(private_scratch(st, kScratchLinear, codes + 2 * scales + 256));
  if (!x_ready) {
    uint8_t* q = scratch;
    if (p.x_dtype == DType::FP8_E4M3) {
      cuda_check(cudaMemcpy2DAsync(q, size_t(kq), p.x, size_t(p.ldx), size_t(k), size_t(m),
                                   cudaMemcpyDeviceToDevice, st),
                 "cudaMemcpy2DAsync (linear, fp8 rows)");
    } else {
      float* s = reinterpret_cast<float*>(scratch + codes);
      quantize_rows(p.x, p.x_dtype, p.ldx, m, k, q, kq, s, st);
      xs = s;
    }
    xq = q;
    ldq = kq;
  }
  if (lt) {
    if (run_linear_cublaslt(p, xq, ldq, xs,
                            reinterpret_cast<float*>(scratch + codes + scales + 128), st))
      return true;
    if (tuning.backend == 2) return false;
  }
  launch_fp8_gemm(p, xq, ldq, xs, st);
  return true;
}

}  // namespace sieve::cuda
