// Fused Gemma RMSNorm + partial NeoX RoPE + paged cache writes (ops::QkvNormRopeCacheParams).
//
// One warp per (token, head vector); the head vectors of a token are its q heads, kv heads
// (k: norm + RoPE + cache; v: raw to cache), index-q heads and the index-k head. Each row of
// the packed projection is read once and each output written once, so the op moves the
// minimum bytes; a warp holds a whole head vector in registers (head_dim / 32 per lane) so the
// norm needs only a warp reduction, and RoPE partners meet through a small per-warp shared
// buffer.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace sieve::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxDim = 128;  // MiniMax-M3 head and index dims; fewer registers, more warps in flight
constexpr int kMaxPerLane = kMaxDim / 32;

enum Job : int { kQ, kK, kV, kIq, kIk };

struct KernelArgs {
  ops::QkvNormRopeCacheParams p;
  int jobs_per_token;
  bool act_bf16;
  bool norm_bf16;
  bool index;  // index branch normed/roped
  bool write_index;
};

__device__ __forceinline__ void store_cache(void* base, int64_t i, DType dt, float v) {
  switch (dt) {
    case DType::F32: static_cast<float*>(base)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(v); break;
    default: static_cast<uint8_t*>(base)[i] = f32_to_fp8_bits(v); break;
  }
}

__global__ void __launch_bounds__(kWarps * 32) qkv_kernel(KernelArgs a) {
  __shared__ float xs[kWarps][kMaxDim];
  const auto& p = a.p;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t job_global = int64_t(blockIdx.x) * kWarps + warp;
  const int64_t t = job_global / a.jobs_per_token;
  if (t >= p.num_tokens) return;
  int j = int(job_global % a.jobs_per_token);

  // Which head vector this warp owns.
  Job kind;
  int head;
  if (j < p.num_q_heads) {
    kind = kQ, head = j;
  } else if ((j -= p.num_q_heads) < p.num_kv_heads) {
    kind = kK, head = j;
  } else if ((j -= p.num_kv_heads) < p.num_kv_heads) {
    kind = kV, head = j;
  } else if ((j -= p.num_kv_heads) < p.num_index_heads) {
    kind = kIq, head = j;
  } else {
    kind = kIk, head = 0;
  }
  const bool is_index = kind == kIq || kind == kIk;
  if (is_index && !a.index) return;
  const int dim = is_index ? p.index_dim : p.head_dim;
  int64_t col;
  const void* w;
  switch (kind) {
    case kQ: col = p.q_offset + int64_t(head) * dim, w = p.q_norm; break;
    case kK: col = p.k_offset + int64_t(head) * dim, w = p.k_norm; break;
    case kV: col = p.v_offset + int64_t(head) * dim, w = nullptr; break;
    case kIq: col = p.index_q_offset + int64_t(head) * dim, w = p.index_q_norm; break;
    default: col = p.index_k_offset, w = p.index_k_norm; break;
  }
  const int64_t row = t * p.row_stride + col;
  const int per_lane = dim / 32;

  // Issue every independent load up front (the op is latency-bound per warp): the vector, its
  // norm weight, the cache slot, and the RoPE cos/sin of this lane's dims.
  const bool transform = kind != kV;
  const bool cached = kind != kQ && kind != kIq;
  const int64_t slot = cached ? p.slot_mapping[t] : -1;
  const int rot = p.rotary_dim, half = rot / 2;
  const float* cs = transform && rot > 0 ? p.cos_sin + int64_t(p.positions[t]) * rot : nullptr;
  float x[kMaxPerLane], wv[kMaxPerLane], cv[kMaxPerLane], sv[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = i * 32 + lane;
    x[i] = i < per_lane ? load_act(p.qkv, row + d, a.act_bf16) : 0.f;
    wv[i] = transform && i < per_lane ? load_act(w, d, a.norm_bf16) : 0.f;
    const int f = d < half ? d : d - half;
    cv[i] = cs && i < per_lane && d < rot ? cs[f] : 1.f;
    sv[i] = cs && i < per_lane && d < rot ? cs[half + f] : 0.f;
  }

  if (transform) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) ss += x[i] * x[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / float(dim) + p.eps);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      if (i < per_lane) {
        x[i] = x[i] * inv * (1.f + wv[i]);
        xs[warp][i * 32 + lane] = x[i];
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = i * 32 + lane;
      if (i < per_lane && d < rot)
        x[i] = d < half ? x[i] * cv[i] - xs[warp][d + half] * sv[i] : x[i] * cv[i] + xs[warp][d - half] * sv[i];
    }
  }

  // q and index_q: back in place, in the activation dtype.
  if (kind == kQ || kind == kIq) {
    if (a.act_bf16) {
      uint16_t* o = static_cast<uint16_t*>(p.qkv) + row;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i)
        if (i < per_lane) o[i * 32 + lane] = f32_to_bf16_bits(x[i]);
    } else {
      float* o = static_cast<float*>(p.qkv) + row;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i)
        if (i < per_lane) o[i * 32 + lane] = x[i];
    }
  }
  if (!cached || slot < 0) return;
  if (kind == kIk) {
    if (!a.write_index) return;
    const auto& ic = p.index_cache;
    const int64_t base = slot * ic.index_dim;  // [num_blocks, block_size, dim] == slot-major
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (i < per_lane) store_cache(ic.k, base + i * 32 + lane, ic.dtype, round_bf16(x[i]));
    return;
  }
  const auto& kv = p.kv;
  const int64_t blk = slot / kv.block_size, off = slot % kv.block_size;
  const int64_t tok_head = (blk * kv.num_kv_heads + head) * kv.block_size + off;
  void* dst = kind == kK ? kv.k : kv.v;
  float scale = 1.f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) x[i] = round_bf16(x[i]);
  if (kv.dtype == DType::FP8_E4M3) {
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    scale = amax > 0.f ? amax / 448.f : 1.f;
    if (lane == 0) (kind == kK ? kv.k_scale : kv.v_scale)[tok_head] = scale;
  }
  const int64_t base = tok_head * kv.head_dim;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (i < per_lane)
      store_cache(dst, base + i * 32 + lane, kv.dtype,
                  kv.dtype == DType::FP8_E4M3 ? x[i] / scale : x[i]);
}

bool cache_dtype_ok(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::FP8_E4M3; }

}  // namespace

bool run_qkv_norm_rope_cache(const ops::QkvNormRopeCacheParams& p, void* stream) {
  if (p.act_dtype != DType::F32 && p.act_dtype != DType::BF16) return false;
  if (p.norm_dtype != DType::F32 && p.norm_dtype != DType::BF16) return false;
  if (p.head_dim % 32 != 0 || p.head_dim > kMaxDim || p.head_dim <= 0) return false;
  if (p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim) return false;
  if (!cache_dtype_ok(p.kv.dtype)) return false;
  if (p.kv.head_dim != p.head_dim) return false;
  const bool has_index = p.num_index_heads > 0 && p.index_dim > 0;
  if (has_index) {
    if (p.index_dim % 32 != 0 || p.index_dim > kMaxDim || p.rotary_dim > p.index_dim) return false;
    if (p.index_cache.k && !cache_dtype_ok(p.index_cache.dtype)) return false;
  }
  if (p.num_tokens == 0) return true;
  KernelArgs a{};
  a.p = p;
  a.act_bf16 = p.act_dtype == DType::BF16;
  a.norm_bf16 = p.norm_dtype == DType::BF16;
  a.index = has_index && p.norm_rope_index;
  // Shared-top-k layers (norm_rope_index false) neither transform nor cache index vectors.
  a.write_index = a.index && p.index_cache.k != nullptr;
  a.jobs_per_token = p.num_q_heads + 2 * p.num_kv_heads + (has_index ? p.num_index_heads + 1 : 0);
  const int64_t jobs = p.num_tokens * a.jobs_per_token;
  const int64_t grid = (jobs + kWarps - 1) / kWarps;
  qkv_kernel<<<unsigned(grid), kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(a);
  SIEVE_LAUNCH_CHECK("qkv_norm_rope_cache");
  return true;
}

}  // namespace sieve::cuda
