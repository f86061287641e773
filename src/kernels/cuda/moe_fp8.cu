// FP8 moe_experts (kernels/ops.h; CPU twin in kernels/cpu/cpu_moe.cpp; docs/kernels.md "FP8 MoE"):
// the host side and the small kernels around the two grouped products.
//
// Per chunk of tokens (as many as fit a 1 GiB scratch: 8192 tokens x top-4 at one TP4 rank of
// MiniMax-M3 are one chunk), five kernels, no host synchronisation (CUDA-graph safe):
//  1. sort (one CTA): each expert's (token, slot) pairs, their sorted rows and row blocks (128 rows
//     for the tile kernels, 8 to 64 for the stream kernels); and the per-expert TMA tensor maps of
//     both weight matrices, copied from a template encoded on the host with the expert's address
//     put in by tensormap.replace (the expert pointers live in device memory): with the map cache,
//     kept per weight set and written only where an expert's address changed;
//  2. quantize: x per 1 x 128 token group (the contract's quantizer, bit for bit), each token's row
//     written to the sorted row of each of its pairs (FP8 x: copied with its scales);
//  3. gate_up: the tile or stream kernel, SwiGLU-OAI and the 1 x 128 quantization of its output
//     in the epilogue (moe_fp8_tile.cu, moe_fp8_stream.cu);
//  4. down: the same kernels, each pair's output row in bf16;
//  5. combine: out[t] += sum of weight x row over the token's experts, in expert-id order (the
//     CPU's order), fp32, one rounding to out's dtype.
// The stream path launches 1-5 (the sort: MoeTuning::fp8_sort_pdl) with programmatic dependent
// launch (MoeTuning::fp8_pdl): each kernel starts while the previous one finishes (the sort
// checks the cache's maps, the stream kernels load their first weight stages, before they
// wait). Grids come from upper bounds on the work (pairs / rows + experts blocks);
// persistent CTAs stop at the sort's count.
#include "kernels/cuda/moe_fp8.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/moe_common.cuh"
#include "kernels/cuda/moe_fp8.cuh"
#include "kernels/cuda/moe_fp8_work.h"
#include "kernels/cuda/tuning.h"

namespace sieve::cuda {

namespace moe_fp8 {
namespace {

constexpr int kMaxTopk = 32;
constexpr int kMaxExperts = 4096;  // the sort's two int32 an expert in shared memory
constexpr int kSortThreads = 1024;
constexpr size_t kScratchBytes = size_t(1) << 30;

// Step 1. The sort (moe_common.cuh's sort_pairs, with each pair's sorted row in pos), and
// maps[e], maps[E + e]: expert e's gate_up and down maps. addr (the map cache, or null):
// addr[e], addr[E + e] hold the expert addresses that maps[e], maps[E + e] were made for, and
// only a map whose expert moved is written again (a map is a function of the address and the
// shape, which the cache key fixes).
__device__ __forceinline__ void write_maps(CUtensorMap* maps, const void** addr, int E, const CUtensorMap& tmpl_gu,
                                           const CUtensorMap& tmpl_dn, const void* const* w_gu,
                                           const void* const* w_dn) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const void* a_gu = w_gu[e];
    const void* a_dn = w_dn[e];
    if (!addr || addr[e] != a_gu) {
      maps[e] = tmpl_gu;
      tensormap_set_address(&maps[e], a_gu);
      if (addr) addr[e] = a_gu;
    }
    if (!addr || addr[E + e] != a_dn) {
      maps[E + e] = tmpl_dn;
      tensormap_set_address(&maps[E + e], a_dn);
      if (addr) addr[E + e] = a_dn;
    }
  }
}
// With programmatic dependent launch the cache's maps are checked and written before the wait
// for moe_route: they depend only on the weights and live in memory of their own, whose only
// readers are this weight set's products, and none of an earlier call can still run: the
// combine that ends every call never lets its dependents start early (combine_kernel has no
// pdl_trigger), so whatever follows it starts only once it, and the products it waited for, have
// completed. The scratch's maps are written after the wait: the routing keeps its logits at the
// start of the same scratch (moe_route.cu) and may still be reading them.
__global__ void __launch_bounds__(kSortThreads) sort_kernel(const int32_t* ids, int pairs, int E, int R,
                                                            int32_t* offsets, int32_t* blk_start, int32_t* sorted,
                                                            int32_t* pos, CUtensorMap* maps, const void** addr,
                                                            const __grid_constant__ CUtensorMap tmpl_gu,
                                                            const __grid_constant__ CUtensorMap tmpl_dn,
                                                            const void* const* w_gu, const void* const* w_dn,
                                                            bool scan) {
  extern __shared__ int32_t sort_smem[];
  pdl_trigger();
  if (addr) write_maps(maps, addr, E, tmpl_gu, tmpl_dn, w_gu, w_dn);
  pdl_wait();
  if (!addr) write_maps(maps, addr, E, tmpl_gu, tmpl_dn, w_gu, w_dn);
  tensormap_release();
  sort_pairs(ids, pairs, E, R, sort_smem, sort_smem + E, offsets, blk_start, sorted, pos, scan);
}

// Step 2. A warp a token's two 1 x 128 groups 2 p and 2 p + 1 (lanes 0-15 and 16-31), 8
// consecutive elements a lane, read as two 4-element loads that are both in flight before the
// group's amax is taken (a lane's 8 elements are all in or all out: H % 16 == 0). kind 0: F32 x,
// 1: BF16 x, 2: FP8 x with x_scale. pos null: row t of xq is token t (a plain quantization).
// Row r's scale of group gi goes to xs[r * xs_row + gi * xs_group] (row-major or k-block-major).
// tail (k-block-major scales, rows_cap cap): the sort's row count; the rows from it to the next
// multiple of 4 get scale 0 in xs and in as ([as_groups][cap], the gate_up product's output),
// which no product writes but the bulk copies of a unit's or tile's scales read (16-byte runs):
// their columns are masked, and stay finite.
// With programmatic dependent launch the kernel waits for the sort before anything else and only
// then lets gate_up start, so that gate_up, which reads the sort's lists and tensor maps before
// its own wait, finds them complete.
__global__ void quantize_kernel(const void* x, int kind, const float* x_scale, int64_t ldx, int64_t T, int H,
                                int topk, const int32_t* pos, uint8_t* xq, int64_t ldq, float* xs, int64_t xs_row,
                                int64_t xs_group, const int32_t* tail, int64_t cap, float* as, int as_groups) {
  pdl_wait();
  pdl_trigger();
  const int groups = (H + kGroup - 1) / kGroup, pgroups = (groups + 1) / 2;
  if (tail && blockIdx.x == 0) {
    const int64_t r0 = *tail, n = min(cap, (r0 + 3) / 4 * 4) - r0;
    for (int64_t idx = threadIdx.x; idx < n * (groups + as_groups); idx += blockDim.x) {
      const int64_t gg = idx / n, r = r0 + idx % n;
      if (gg < groups) {
        xs[gg * cap + r] = 0.0f;
      } else {
        as[(gg - groups) * cap + r] = 0.0f;
      }
    }
  }
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t wi = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; wi < T * pgroups; wi += warps) {
    const int64_t t = wi / pgroups;
    const int gi = 2 * int(wi - t * pgroups) + (lane >> 4);
    const int k = gi * kGroup + 8 * (lane & 15);
    const bool in = k < H;
    uint2 packed = make_uint2(0, 0);
    float scale = 1.0f;
    if (kind == 2) {
      if (in) {
        const uint32_t* src = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(x) + t * ldx + k);
        packed = make_uint2(src[0], src[1]);
        scale = x_scale[t * groups + gi];
      }
    } else {
      float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      if (in) {
        float a[4], b[4];
        if (kind == 0) {
          const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(x) + t * ldx + k);
          const float4 u0 = src[0], u1 = src[1];
          unpack_f32x4(u0, a);
          unpack_f32x4(u1, b);
        } else {
          const uint2* src = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(x) + t * ldx + k);
          const uint2 u0 = src[0], u1 = src[1];
          unpack_bf16x4(u0, a);
          unpack_bf16x4(u1, b);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = a[i], v[4 + i] = b[i];
      }
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      scale = group_scale(amax);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        packed.x |= uint32_t(quant(v[i], scale)) << (8 * i);
        packed.y |= uint32_t(quant(v[4 + i], scale)) << (8 * i);
      }
    }
    for (int j = 0; j < (pos ? topk : 1); ++j) {
      const int64_t r = pos ? pos[t * topk + j] : t;
      if (r < 0 || !in) continue;
      *reinterpret_cast<uint2*>(xq + r * ldq + k) = packed;
      if ((lane & 15) == 0) xs[r * xs_row + gi * xs_group] = scale;
    }
  }
}

// Step 5. A CTA a token (x) and a slice of its columns (y: a decode batch's few tokens still
// fill the GPU); 8 elements (16 bytes of y) a thread at a time, a bf16 out read and written as
// one 16-byte vector too (H % 16 == 0: the run starts 16-byte aligned when out does). It never
// lets its dependents start early (no pdl_trigger): the sort of the next chunk or call relies on
// it (step 1). The token's slot order and weights are found once, before the column loop.
// kRegs (top-k up to kCombineSlots; M3: 4): the order found in registers (a valid slot's place is
// the count of valid slots with a lower id, or the same id and a lower slot: expert_order's order)
// and all of a thread's loads (out's, its slots' 16 bytes of y) issued before the first sum;
// otherwise expert_order and one slot's load at a time. The same sums either way.
constexpr int kCombineThreads = 128, kCombineSlots = 8;
template <bool kRegs>
__global__ void combine_kernel(const int32_t* ids, const float* weights, int topk, int E, const uint16_t* y,
                               int64_t H, void* out, int ot) {
  pdl_wait();
  const bool out_vec = ot == kElemBF16 && (reinterpret_cast<uintptr_t>(out) & 15) == 0;
  const int64_t t = blockIdx.x;
  constexpr int kSlots = kRegs ? kCombineSlots : kMaxTopk;
  int order[kSlots];
  float w[kSlots];
  int n = 0;
  if constexpr (kRegs) {
    int e[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int v = j < topk ? ids[t * topk + j] : -1;
      e[j] = v >= 0 && v < E ? v : -1;
      order[j] = 0;
    }
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      int at = 0;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) at += e[i] >= 0 && (e[i] < e[j] || (e[i] == e[j] && i < j));
#pragma unroll
      for (int r = 0; r < kSlots; ++r)
        if (e[j] >= 0 && r == at) order[r] = j;
      n += e[j] >= 0;
    }
  } else {
    n = expert_order(ids, t, topk, E, order);
  }
#pragma unroll
  for (int r = 0; r < kSlots; ++r) w[r] = r < n ? weights[t * topk + order[r]] : 0.0f;
  for (int64_t d = 8 * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x); d < H;
       d += 8 * int64_t(blockDim.x) * gridDim.y) {
    float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    auto add = [&](float wj, uint4 v) {
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sum[2 * i] = __fadd_rn(sum[2 * i], __fmul_rn(wj, __uint_as_float(u[i] << 16)));
        sum[2 * i + 1] = __fadd_rn(sum[2 * i + 1], __fmul_rn(wj, __uint_as_float(u[i] & 0xffff0000u)));
      }
    };
    uint4* const dst = reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + t * H + d);
    const uint4 o = out_vec ? *dst : make_uint4(0, 0, 0, 0);
    if constexpr (kRegs) {
      uint4 v[kSlots];
#pragma unroll
      for (int r = 0; r < kSlots; ++r)
        if (r < n) v[r] = ldg_stream(y + (t * topk + order[r]) * H + d);
#pragma unroll
      for (int r = 0; r < kSlots; ++r)
        if (r < n) add(w[r], v[r]);
    } else {
      for (int r = 0; r < n; ++r) add(w[r], *reinterpret_cast<const uint4*>(y + (t * topk + order[r]) * H + d));
    }
    if (out_vec) {
      const uint32_t ou[4] = {o.x, o.y, o.z, o.w};
      uint32_t r[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        r[i] = pack_bf16x2(__fadd_rn(__uint_as_float(ou[i] << 16), sum[2 * i]),
                           __fadd_rn(__uint_as_float(ou[i] & 0xffff0000u), sum[2 * i + 1]));
      *dst = make_uint4(r[0], r[1], r[2], r[3]);
      continue;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t oi = t * H + d + i;
      st_elem(out, ot, oi, __fadd_rn(ld_elem(out, ot, oi), sum[i]));
    }
  }
}

// Tests (MoeFp8Probe): the sorted rows' quantized SwiGLU rows and scales copied to their pairs'
// places; a CTA a sorted row.
__global__ void probe_kernel(const int32_t* offsets, int E, const int32_t* sorted, const uint8_t* aq, const float* as,
                             int64_t as_row, int64_t as_group, int I, int64_t pair0, uint8_t* out_q, float* out_s) {
  const int groups = (I + kGroup - 1) / kGroup;
  for (int r = blockIdx.x; r < offsets[E]; r += gridDim.x) {
    const int64_t pair = pair0 + sorted[r];
    for (int u = threadIdx.x; u < I; u += blockDim.x) out_q[pair * I + u] = aq[int64_t(r) * I + u];
    for (int gi = threadIdx.x; gi < groups; gi += blockDim.x)
      out_s[pair * groups + gi] = as[int64_t(r) * as_row + gi * as_group];
  }
}

// Tile kernels with k-block-major scales from row-major ones: every expert's weight multipliers of
// one product, ws[e] [ceil(N / sbr)][nkb] (row-major over blocks), tiled as wst [E][rbs][nkb][256]
// (ops::fp8_scales_moe_tiled's layout: the tiles' 256-row blocks in their row order, zeros past
// the rows). A CTA moves 32 slots (32 consecutive weight rows) x 32 k blocks of one expert through
// shared memory, so that both the reads (along k) and the writes (along the slots) are 128-byte runs.
template <bool kGateUp>
__global__ void scale_tile_kernel(const float* const* ws, int inter, int hidden, int sbr, int nkb, int rbs,
                                  float* wst) {
  __shared__ float tile[32][33];
  const int e = blockIdx.z, rb = blockIdx.x >> 3, c0 = (blockIdx.x & 7) * 32, k0 = blockIdx.y * 32;
  const float* src = ws[e];
  const int tx = threadIdx.x, ty = threadIdx.y;  // 32 x 8
  for (int i = ty; i < 32; i += 8) {
    bool ok;
    const int n = kGateUp ? gate_up_row(rb, c0 + i, inter, ok) : down_row(rb, c0 + i, hidden, ok);
    const int kb = k0 + tx;
    if (kb < nkb) tile[i][tx] = ok ? src[int64_t(n / sbr) * nkb + kb] : 0.0f;
  }
  __syncthreads();
  for (int i = ty; i < 32; i += 8) {
    const int kb = k0 + i;
    if (kb < nkb) wst[((int64_t(e) * rbs + rb) * nkb + kb) * 256 + c0 + tx] = tile[tx][i];
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A map over a [rows, cols] fp8 matrix (row stride ld bytes) in boxes of box_rows x 128 bytes,
// 128-byte swizzle; reads past the matrix give zeros.
bool fp8_map(CUtensorMap* map, const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
  auto fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld)};
  const cuuint32_t box[2] = {128, cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, estr,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

size_t align1k(size_t b) { return (b + 1023) / 1024 * 1024; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Token rows of a stream unit: the smallest of 8, 16, 32, 64 that holds about 1.5 x the average
// rows of a touched expert (experts with more get several units).
int stream_rows_for(int64_t pairs, int E) {
  const double avg = double(pairs) / double(std::min<int64_t>(E, pairs));
  for (int nt : {8, 16, 32}) {
    if (1.5 * avg <= nt) return nt;
  }
  return 64;
}

bool capturing(cudaStream_t st) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone;
}

// The map cache (MoeTuning::fp8_map_cache): per weight set, device memory for its 2 E weight
// maps and the 2 E expert addresses they were made for, all ones when made (no expert's address:
// the first sort writes every map). Keyed by the device, the two pointer arrays' addresses and the shapes the map
// template encodes; the sort checks each expert's address on every call, so pointer arrays freed
// and made again at the same address with other experts are safe. Entries live as long as the
// process (34 KiB for 128 experts; at most kMapCacheEntries, then calls go without).
// Made only outside stream capture; a call captured before its weight set was seen writes the
// maps in the scratch as without the cache. One stream at a time may use a weight set.
constexpr size_t kMapCacheEntries = 4096;
struct CachedMaps {
  CUtensorMap* maps = nullptr;
  const void** addr = nullptr;
};
CachedMaps cached_maps(const ops::MoeExpertsParams& p, cudaStream_t st) {
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "moe_experts fp8: the device");
  using Key = std::tuple<int, const void*, const void*, int64_t, int64_t, int64_t>;
  static std::mutex mu;
  static std::map<Key, CachedMaps> cache;
  const Key key(dev, p.w_gate_up, p.w_down, p.num_experts, p.inter, p.hidden);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMapCacheEntries || capturing(st)) return {};
  const size_t n = 2 * size_t(p.num_experts);
  void* mem = nullptr;
  cuda_check(cudaMalloc(&mem, n * (sizeof(CUtensorMap) + sizeof(void*))), "moe_experts fp8: the map cache");
  CachedMaps c;
  c.maps = static_cast<CUtensorMap*>(mem);  // cudaMalloc: 256-byte aligned, maps need 64
  c.addr = reinterpret_cast<const void**>(c.maps + n);
  cuda_check(cudaMemsetAsync(c.addr, 0xFF, n * sizeof(void*), st), "moe_experts fp8: the map cache");
  cuda_check(cudaStreamSynchronize(st), "moe_experts fp8: the map cache");
  cache.emplace(key, c);
  return c;
}

// Tile kernels' parameter maps: each expert's gate_up and down maps (64-row boxes), encoded on the
// host from the expert pointers, which it reads from the device (one synchronisation of st). The
// maps depend only on an expert's address and shape, so they are kept per address.
bool host_weight_maps(const ops::MoeExpertsParams& p, cudaStream_t st, TileMaps* gu, TileMaps* dn) {
  const int E = p.num_experts;
  std::vector<const void*> w(2 * size_t(E));
  cuda_check(cudaMemcpyAsync(w.data(), p.w_gate_up, size_t(E) * sizeof(void*), cudaMemcpyDeviceToHost, st),
             "moe_experts fp8: reading the gate_up pointers");
  cuda_check(cudaMemcpyAsync(w.data() + E, p.w_down, size_t(E) * sizeof(void*), cudaMemcpyDeviceToHost, st),
             "moe_experts fp8: reading the down pointers");
  cuda_check(cudaStreamSynchronize(st), "moe_experts fp8: reading the expert pointers");
  static std::mutex mu;
  static std::map<std::tuple<const void*, int64_t, int64_t>, CUtensorMap> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto map_of = [&](const void* base, int64_t rows, int64_t cols, CUtensorMap* out) {
    const auto key = std::make_tuple(base, rows, cols);
    auto it = cache.find(key);
    if (it == cache.end()) {
      CUtensorMap m{};
      if (!weight_map(&m, base, rows, cols)) return false;
      it = cache.emplace(key, m).first;
    }
    *out = it->second;
    return true;
  };
  for (int e = 0; e < E; ++e) {
    if (!map_of(w[size_t(e)], 2 * p.inter, p.hidden, &gu->m[e]) ||
        !map_of(w[size_t(E + e)], p.hidden, p.inter, &dn->m[e]))
      return false;
  }
  return true;
}

}  // namespace

bool weight_map(CUtensorMap* map, const void* base, int64_t rows, int64_t cols) {
  return fp8_map(map, base, rows, cols, cols, 64);
}

bool run(const ops::MoeExpertsParams& p, cudaStream_t st, const MoeFp8Probe* probe) {
  const int64_t H = p.hidden, I = p.inter, T = p.num_tokens, E = p.num_experts, topk = p.topk;
  const bool fp8_x = p.x_scale != nullptr;
  if (p.scale_tiled && (p.scale_block_rows != 1 || p.scale_block_cols != kGroup))
    throw Error("moe_experts: tiled scales (scale_tiled) need (1, 128) blocks");
  if (p.scale_block_cols != kGroup || p.scale_block_rows < 1) return false;
  if (p.act_dtype != DType::F32 && p.act_dtype != DType::BF16) return false;
  if (H % 16 || I % 16 || H < 128 || I < 128 || H > (1 << 20) || I > (1 << 20)) return false;
  if (topk > kMaxTopk || E > kMaxExperts) return false;
  const size_t xalign = fp8_x ? 4 : (p.act_dtype == DType::F32 ? 16 : 8);
  if (reinterpret_cast<uintptr_t>(p.x) % xalign) return false;
  if (!encode_fn()) return false;
  const MoeTuning& knobs = tuning().moe;
  const int sms = num_sms();
  const int gh = int(ceil_div(H, kGroup)), gi = int(ceil_div(I, kGroup));
  const int rb_gu = int(ceil_div(I, 128)), rb_dn = int(ceil_div(H, 256));  // the kernels' 256-row blocks

  // Tile kernels with k-block-major scales: row-major weight multipliers of both products copied
  // tiled (once a call, before the chunks), where they take at most a quarter of the scratch;
  // weights whose scales are tiled already (p.scale_tiled) are read in place.
  const bool w_tiled = p.scale_tiled;
  const size_t wst_gu = w_tiled ? 0 : size_t(E) * size_t(rb_gu) * size_t(gh) * 256;
  const size_t wst_dn = w_tiled ? 0 : size_t(E) * size_t(rb_dn) * size_t(gi) * 256;
  const bool kmajor_fits = 4 * (wst_gu + wst_dn) <= kScratchBytes / 4;
  const size_t fixed_bytes = (size_t(64) << 20) + (kmajor_fits ? 4 * (wst_gu + wst_dn) + 2048 : 0);

  // Tokens a chunk: every buffer of its pairs fits the scratch.
  const size_t pair_bytes = size_t(H) + 4 * size_t(gh) + size_t(I) + 4 * size_t(gi) + 2 * size_t(H) + 8;
  int64_t chunk = int64_t((kScratchBytes - fixed_bytes) / (pair_bytes * size_t(topk)));
  if (knobs.chunk_tokens > 0) chunk = knobs.chunk_tokens;
  chunk = std::max<int64_t>(1, std::min<int64_t>({chunk, T, (int64_t(1) << 24) / topk}));
  const int64_t cap = (chunk * topk + 3) / 4 * 4;  // rows of every per-pair buffer (bulk scale copies: % 4)

  // Path and row blocks: the largest chunk decides (the scratch layout must not change in a chunk
  // loop); the stream kernels while the pairs are few per expert.
  const int64_t pairs_max = chunk * topk;
  bool stream = pairs_max <= int64_t(knobs.fp8_stream_pairs_per_expert) * E;
  if (knobs.fp8_path == 1) stream = true;
  if (knobs.fp8_path == 2) stream = false;
  // (The tile kernels read k-block-major weight scales only in their k-block-major modes.)
  const bool kmajor = !stream && ((knobs.fp8_tile_kmajor_scales && kmajor_fits) || w_tiled);
  const TileScales scales =
      !kmajor ? TileScales::kRowMajor : (knobs.fp8_tile_bulk_scales ? TileScales::kBulk : TileScales::kKmajor);
  // MoeTuning::fp8_tile_block_scales: weight blocks of 128 rows or more (HF fp8, --quantization
  // fp8) promote with one multiplier for each half's gate rows and one for its up rows (64 rows
  // each: I % 64 == 0), down's with one for each half (128 rows); the same products.
  const bool block_gu = scales == TileScales::kBulk && knobs.fp8_tile_block_scales && p.scale_block_rows % 128 == 0 &&
                        I % 64 == 0;
  const bool block_dn = scales == TileScales::kBulk && knobs.fp8_tile_block_scales && p.scale_block_rows % 128 == 0;
  const int nt = stream ? (knobs.fp8_stream_rows ? knobs.fp8_stream_rows : stream_rows_for(pairs_max, int(E))) : 0;
  if (stream && nt != 8 && nt != 16 && nt != 32 && nt != 64) return false;
  const int R = stream ? nt : 128;
  const int kp = knobs.fp8_stream_kblocks ? knobs.fp8_stream_kblocks : (nt <= 16 ? 2 : 1);
  if (stream && (kp < 1 || kp > 4)) return false;
  const int64_t experts_max = std::min<int64_t>(E, pairs_max);
  const int64_t blocks_max = pairs_max / R + experts_max;  // row blocks, an upper bound
  auto ksplit = [&](int forced, int rbs, int nkb) {
    if (forced > 0) return std::min(forced, nkb);
    return host_ksplit(experts_max * rbs, nkb, sms);
  };
  int ks_gu = stream ? ksplit(knobs.fp8_ksplit_gate_up, rb_gu, gh) : 1;
  int ks_dn = stream ? ksplit(knobs.fp8_ksplit_down, rb_dn, gi) : 1;
  // MoeTuning::fp8_ksplit_waves: the kernels pick their split, up to kw_* (0: the host's ks_*),
  // as many as a 32 MiB partial-sum buffer holds for the largest row-block count.
  int kw_gu = 0, kw_dn = 0;
  if (stream && nt <= 32 && knobs.fp8_ksplit_waves > 0) {
    auto waves_cap = [&](int forced, int rbs, int nkb) {
      if (forced > 0) return 0;
      const int64_t per_split = blocks_max * 256 * nt * rbs * 4;
      const int64_t c = std::min<int64_t>({(int64_t(32) << 20) / per_split, knobs.fp8_ksplit_waves, nkb});
      return c >= 2 ? int(c) : 0;
    };
    kw_gu = waves_cap(knobs.fp8_ksplit_gate_up, rb_gu, gh);
    kw_dn = waves_cap(knobs.fp8_ksplit_down, rb_dn, gi);
    if (kw_gu) ks_gu = 1;
    if (kw_dn) ks_dn = 1;
  }
  const int kmax_gu = std::max(ks_gu, kw_gu), kmax_dn = std::max(ks_dn, kw_dn);
  const size_t partial_floats =
      stream ? size_t(blocks_max) * 256 * size_t(nt) *
                   size_t(std::max<int64_t>(kmax_gu > 1 ? int64_t(rb_gu) * kmax_gu : 0,
                                            kmax_dn > 1 ? int64_t(rb_dn) * kmax_dn : 0))
             : 0;

  // Scratch: [maps][offsets][blk_start][sorted][pos][xq][xs][aq][as][y][partial].
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = align1k(off + bytes);
    return at;
  };
  const size_t o_maps = take(2 * size_t(E) * sizeof(CUtensorMap));
  const size_t o_off = take(size_t(E + 1) * 4), o_blk = take(size_t(E + 1) * 4);
  const size_t o_sorted = take(size_t(cap) * 4), o_pos = take(size_t(cap) * 4);
  const size_t o_xq = take(size_t(cap) * size_t(H)), o_xs = take(size_t(cap) * size_t(gh) * 4);
  const size_t o_aq = take(size_t(cap) * size_t(I)), o_as = take(size_t(cap) * size_t(gi) * 4);
  const size_t o_y = take(size_t(cap) * size_t(H) * 2);
  const size_t o_partial = take(partial_floats * 4);
  const size_t o_wst_gu = take(kmajor ? wst_gu * 4 : 0), o_wst_dn = take(kmajor ? wst_dn * 4 : 0);
  auto* base = static_cast<uint8_t*>(private_scratch(st, kScratchMoe, off));
  auto* maps = reinterpret_cast<CUtensorMap*>(base + o_maps);
  auto* offsets = reinterpret_cast<int32_t*>(base + o_off);
  auto* blk_start = reinterpret_cast<int32_t*>(base + o_blk);
  auto* sorted = reinterpret_cast<int32_t*>(base + o_sorted);
  auto* pos = reinterpret_cast<int32_t*>(base + o_pos);
  uint8_t* xq = base + o_xq;
  auto* xs = reinterpret_cast<float*>(base + o_xs);
  uint8_t* aq = base + o_aq;
  auto* as = reinterpret_cast<float*>(base + o_as);
  auto* y = reinterpret_cast<uint16_t*>(base + o_y);
  auto* partial = reinterpret_cast<float*>(base + o_partial);
  auto* wst_gu_p = reinterpret_cast<float*>(base + o_wst_gu);
  auto* wst_dn_p = reinterpret_cast<float*>(base + o_wst_dn);
  const int64_t n_cnt_gu = kmax_gu > 1 ? blocks_max * rb_gu : 0, n_cnt_dn = kmax_dn > 1 ? blocks_max * rb_dn : 0;
  // The tile kernels' dynamic order: 2 counters for gate_up, 2 for down, after the stream kernels'.
  const int64_t n_cnt_tiles = !stream && knobs.fp8_tile_dynamic ? 4 : 0;
  const int64_t n_cnt = n_cnt_gu + n_cnt_dn + n_cnt_tiles;
  int32_t* counters = n_cnt > 0 ? zeroed_counters(st, size_t(n_cnt)) : nullptr;
  int32_t* const tile_counters = n_cnt_tiles > 0 ? counters + n_cnt_gu + n_cnt_dn : nullptr;

  // Tensor maps: the weight templates (any valid address; the sort puts each expert's in), the
  // activation buffers' maps in the kernel's box height.
  CUtensorMap tmpl_gu{}, tmpl_dn{}, map_x{}, map_a{};
  const int box = stream ? nt : 64;
  if (!weight_map(&tmpl_gu, base, 2 * I, H) || !weight_map(&tmpl_dn, base, H, I) ||
      !fp8_map(&map_x, xq, cap, H, H, box) || !fp8_map(&map_a, aq, cap, I, I, box))
    return false;

  const bool pdl = stream && knobs.fp8_pdl;
  const bool sort_pdl = pdl && knobs.fp8_sort_pdl;
  // The experts' weight maps: the cache's (kept per weight set) or the scratch's (all written
  // every call).
  const CachedMaps cached = knobs.fp8_map_cache ? cached_maps(p, st) : CachedMaps{};
  CUtensorMap* const wmaps = cached.maps ? cached.maps : maps;
  const void** const wmaps_addr = cached.addr;
  const size_t esz = dtype_size(p.act_dtype);
  const DType out_t = ops::moe_out_dtype(p);
  const int xkind = fp8_x ? 2 : (p.act_dtype == DType::F32 ? 0 : 1);
  // Activation scale layouts: row-major [row][group] (the tile kernels' row-major mode), or
  // k-block-major [group][row] (rows of the chunk's cap; the stream kernels' bulk copies).
  const bool a_kmajor = stream || kmajor;
  const int64_t xs_row = a_kmajor ? 1 : gh, xs_group = a_kmajor ? cap : 1;
  const int64_t as_row = a_kmajor ? 1 : gi, as_group = a_kmajor ? cap : 1;
  std::unique_ptr<TileMaps> maps_gu, maps_dn;
  if (kmajor && !w_tiled) {
    const dim3 tb(32, 8);
    scale_tile_kernel<true><<<dim3(unsigned(rb_gu * 8), unsigned(ceil_div(gh, 32)), unsigned(E)), tb, 0, st>>>(
        p.w_gate_up_scale, int(I), int(H), p.scale_block_rows, gh, rb_gu, wst_gu_p);
    SIEVE_LAUNCH_CHECK("moe_experts fp8 (gate_up scales)");
    scale_tile_kernel<false><<<dim3(unsigned(rb_dn * 8), unsigned(ceil_div(gi, 32)), unsigned(E)), tb, 0, st>>>(
        p.w_down_scale, int(I), int(H), p.scale_block_rows, gi, rb_dn, wst_dn_p);
    SIEVE_LAUNCH_CHECK("moe_experts fp8 (down scales)");
  }
  if (kmajor) {
    if (knobs.fp8_tile_param_maps && E <= kTileParamMaps && !capturing(st)) {
      maps_gu = std::make_unique<TileMaps>();
      maps_dn = std::make_unique<TileMaps>();
      if (!host_weight_maps(p, st, maps_gu.get(), maps_dn.get())) maps_gu.reset(), maps_dn.reset();
    }
  }
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t tokens = std::min(chunk, T - t0);
    const int pairs = int(tokens * topk);
    const int32_t* ids = p.ids + t0 * topk;
    const float* weights = p.weights + t0 * topk;

    launch_pdl(sort_pdl, sort_kernel, dim3(1), dim3(kSortThreads), size_t(2 * E) * sizeof(int32_t), st,
               "moe_experts fp8 (sort)", ids, pairs, int(E), R, offsets, blk_start, sorted, pos, wmaps, wmaps_addr,
               tmpl_gu, tmpl_dn, p.w_gate_up, p.w_down, bool(knobs.fp8_sort_scan));

    const void* x = static_cast<const uint8_t*>(p.x) + size_t(t0 * H) * (fp8_x ? 1 : esz);
    const int64_t qwarps = tokens * ((gh + 1) / 2);  // a warp two groups
    const int qblocks = int(std::min<int64_t>(ceil_div(qwarps, 8), int64_t(sms) * 8));
    launch_pdl(pdl, quantize_kernel, dim3(unsigned(qblocks)), dim3(256), 0, st, "moe_experts fp8 (quantize)", x, xkind,
               fp8_x ? p.x_scale + t0 * gh : static_cast<const float*>(nullptr), int64_t(H), tokens, int(H),
               int(topk), static_cast<const int32_t*>(pos), xq, int64_t(H), xs, xs_row, xs_group,
               a_kmajor ? static_cast<const int32_t*>(offsets + E) : nullptr, cap, as, gi);

    GemmArgs g{};
    g.sbr = p.scale_block_rows;
    g.inter = int(I);
    g.hidden = int(H);
    g.rows_cap = int(cap);
    g.offsets = offsets;
    g.blk_start = blk_start;
    g.sorted = sorted;
    g.E = int(E);
    g.act_q = aq;
    g.ld_act = I;
    g.act_scale = as;
    g.y = y;
    g.alpha = p.alpha;
    g.limit = p.limit;
    g.beta = p.beta;
    g.partial = partial;
    g.kp = kp;
    g.experiment = stream ? knobs.fp8_stream_experiment : knobs.fp8_tile_experiment;
    g.wst = nullptr;
    g.wn = 0;
    g.wtiled = w_tiled;
    g.staged_out = knobs.fp8_tile_staged_out > 0 || (knobs.fp8_tile_staged_out < 0 && int64_t(pairs) >= 128 * E);
    g.tile_counter = tile_counters;

    const int64_t pairs_blocks = int64_t(pairs) / R + std::min<int64_t>(E, pairs);
    // gate_up
    g.wmaps = wmaps;
    g.wscale = p.w_gate_up_scale;
    g.nkb = gh;
    g.a_scale = xs;
    g.cols = stream ? rb_gu * ks_gu : rb_gu;
    g.ksplit = ks_gu;
    g.ksplit_max = kw_gu;
    g.counters = counters;
    g.wst = w_tiled ? nullptr : wst_gu_p;
    g.wn = int(2 * I);
    int grid = int(std::min<int64_t>(pairs_blocks * g.cols * std::max(1, kw_gu), sms));
    if (stream) {
      launch_stream(true, nt, map_x, g, grid, pdl, st);
    } else {
      launch_tiles(true, map_x, g, grid, st, scales, maps_gu.get(), block_gu);
    }
    // down
    g.wmaps = wmaps + E;
    g.wscale = p.w_down_scale;
    g.nkb = gi;
    g.a_scale = as;
    g.cols = stream ? rb_dn * ks_dn : rb_dn;
    g.ksplit = ks_dn;
    g.ksplit_max = kw_dn;
    g.counters = counters ? counters + n_cnt_gu : nullptr;
    g.tile_counter = tile_counters ? tile_counters + 2 : nullptr;
    g.wst = w_tiled ? nullptr : wst_dn_p;
    g.wn = int(H);
    grid = int(std::min<int64_t>(pairs_blocks * g.cols * std::max(1, kw_dn), sms));
    if (stream) {
      launch_stream(false, nt, map_a, g, grid, pdl, st);
    } else {
      launch_tiles(false, map_a, g, grid, st, scales, maps_dn.get(), block_dn);
    }
    if (probe) {
      probe_kernel<<<unsigned(std::min<int64_t>(pairs, 4096)), 128, 0, st>>>(
          offsets, int(E), sorted, aq, as, as_row, as_group, int(I), t0 * topk, probe->act_q, probe->act_scale);
      SIEVE_LAUNCH_CHECK("moe_experts fp8 (probe)");
    }

    launch_pdl(pdl, topk <= kCombineSlots ? combine_kernel<true> : combine_kernel<false>,
               dim3(unsigned(tokens), unsigned(ceil_div(H, 8 * kCombineThreads))), dim3(kCombineThreads), 0, st,
               "moe_experts fp8 (combine)", ids, weights, int(topk), int(E), static_cast<const uint16_t*>(y),
               int64_t(H), static_cast<void*>(static_cast<uint8_t*>(p.out) + size_t(t0 * H) * dtype_size(out_t)),
               elem_code(out_t));
  }
  return true;
}

}  // namespace moe_fp8

bool run_moe_experts_fp8(const ops::MoeExpertsParams& p, void* stream, const MoeFp8Probe* probe) {
  if (p.num_tokens <= 0 || p.hidden <= 0) return true;
  if (!p.x || !p.out || !p.ids || !p.weights || !p.w_gate_up || !p.w_down) throw Error("moe_experts: null operand");
  if (p.inter <= 0 || p.topk <= 0 || p.num_experts <= 0) throw Error("moe_experts: bad sizes");
  if (!p.w_gate_up_scale || !p.w_down_scale) throw Error("moe_experts: FP8 weights need their scale arrays");
  return moe_fp8::run(p, static_cast<cudaStream_t>(stream), probe);
}

void quantize_fp8_1x128(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                        float* scale, void* stream) {
  if (rows <= 0) return;
  SIEVE_CHECK(cols % 16 == 0 && (dtype == DType::F32 || dtype == DType::BF16), "quantize_fp8_1x128: cols % 16, F32/BF16");
  const int64_t warps = rows * ((moe_fp8::ceil_div(cols, moe_fp8::kGroup) + 1) / 2);  // a warp two groups
  moe_fp8::quantize_kernel<<<unsigned(std::min<int64_t>(moe_fp8::ceil_div(warps, 8), 65535)), 256, 0,
                             static_cast<cudaStream_t>(stream)>>>(x, dtype == DType::F32 ? 0 : 1, nullptr, ldx, rows,
                                                                  int(cols), 1, nullptr, q, cols, scale,
                                                                  moe_fp8::ceil_div(cols, moe_fp8::kGroup), 1, nullptr,
                                                                  0, nullptr, 0);
  SIEVE_LAUNCH_CHECK("quantize_fp8_1x128");
}

}  // namespace sieve::cuda
