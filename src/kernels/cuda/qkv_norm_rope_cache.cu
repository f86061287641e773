// Fused Gemma RMSNorm + partial NeoX RoPE + paged cache writes (ops::QkvNormRopeCacheParams).
//
// One warp per (token, head vector); the head vectors of a token are its q heads, kv heads
// (k: norm + RoPE + cache; v: raw to cache), index-q heads and the index-k head. Grid (tokens,
// ceil(vectors per token / 8)), 8 warps a CTA: a warp finds its token and vector from the grid
// without integer division. Each row of the packed projection is read once and each output
// written once, so the op moves the minimum bytes. Lane l holds dims 4l..4l+3 of the vector
// (head_dim <= 128): one 8-byte (bf16) or 16-byte (fp32) load and one store per lane and
// tensor where the layout is aligned (checked on the host; else the same lanes use scalar
// accesses), so the norm needs one warp reduction and RoPE partners meet through a small
// per-warp shared buffer. Slots are split into (block, offset) in 32-bit arithmetic when the
// cache has fewer than 2^31 slots.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace sieve::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxDim = 128;  // MiniMax-M3 head and index dims
constexpr int kVec = 4;       // consecutive dims per lane

enum Job : int { kQ, kK, kV, kIq, kIk };

struct KernelArgs {
  ops::QkvNormRopeCacheParams p;
  int jobs_per_token;
  bool act_bf16;
  bool norm_bf16;
  bool index;  // index branch normed/roped
  bool write_index;
  bool vec_rows;   // qkv rows: every vector starts 4-element aligned (vector loads / stores)
  bool vec_norm;   // norm weights 4-element aligned
  bool vec_cs;     // cos/sin: 4 consecutive dims share a side of rotary_dim / 2, 16-byte aligned
  bool vec_cache;  // cache pointers 16-byte aligned
  bool slot32;     // every KV cache slot < 2^31
};

__device__ __forceinline__ void load4(const void* base, int64_t i, bool bf16, bool vec, float (&x)[kVec]) {
  if (vec && bf16) {
    unpack_bf16x4(*reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(base) + i), x);
  } else if (vec) {
    unpack_f32x4(*reinterpret_cast<const float4*>(static_cast<const float*>(base) + i), x);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = load_act(base, i + k, bf16);
  }
}

// Four values to base[i..i+3] in dtype dt (F32, BF16 or FP8_E4M3 bits).
__device__ __forceinline__ void store4(void* base, int64_t i, DType dt, bool vec, const float (&x)[kVec]) {
  if (dt == DType::F32) {
    float* o = static_cast<float*>(base) + i;
    if (vec) *reinterpret_cast<float4*>(o) = make_float4(x[0], x[1], x[2], x[3]);
    else
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] = x[k];
  } else if (dt == DType::BF16) {
    uint16_t* o = static_cast<uint16_t*>(base) + i;
    if (vec) *reinterpret_cast<uint2*>(o) = make_uint2(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]));
    else
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] = f32_to_bf16_bits(x[k]);
  } else {
    uint8_t* o = static_cast<uint8_t*>(base) + i;
    uint8_t b[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) b[k] = f32_to_fp8_bits(x[k]);
    if (vec)
      *reinterpret_cast<uint32_t*>(o) = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
    else
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] = b[k];
  }
}

__global__ void __launch_bounds__(kWarps * 32) qkv_kernel(KernelArgs a) {
  __shared__ float xs[kWarps][kMaxDim];
  const auto& p = a.p;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x;
  int j = int(blockIdx.y) * kWarps + warp;
  // PDL (common.cuh): the next kernel may start; this one reads its position and slot before
  // waiting for the previous kernel, the activations and every write after it.
  pdl_trigger();
  if (j >= a.jobs_per_token) {
    pdl_wait();
    return;
  }

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
  if (is_index && !a.index) {
    pdl_wait();
    return;
  }
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
  const int d0 = lane * kVec;
  const bool on = d0 < dim;  // dim is a multiple of 32: a lane has all 4 dims or none

  // Issue every independent load up front (the op is latency-bound per warp): the vector, its
  // norm weight, the cache slot, and the RoPE cos/sin of this lane's dims.
  const bool transform = kind != kV;
  const bool cached = kind != kQ && kind != kIq;
  const int64_t slot = cached && p.slot_mapping ? p.slot_mapping[t] : -1;
  const int rot = p.rotary_dim, half = rot / 2;
  const float* cs = transform && rot > 0 ? p.cos_sin + int64_t(p.positions[t]) * rot : nullptr;
  float x[kVec] = {0.f, 0.f, 0.f, 0.f}, wv[kVec] = {0.f, 0.f, 0.f, 0.f};
  float cv[kVec] = {1.f, 1.f, 1.f, 1.f}, sv[kVec] = {0.f, 0.f, 0.f, 0.f};
  pdl_wait();
  if (on) {
    load4(p.qkv, row + d0, a.act_bf16, a.vec_rows, x);
    if (transform && w) load4(w, d0, a.norm_bf16, a.vec_norm, wv);
    if (cs && d0 < rot) {
      const int f0 = d0 < half ? d0 : d0 - half;
      if (a.vec_cs) {
        const float4 c = *reinterpret_cast<const float4*>(cs + f0);
        const float4 sn = *reinterpret_cast<const float4*>(cs + half + f0);
        cv[0] = c.x, cv[1] = c.y, cv[2] = c.z, cv[3] = c.w;
        sv[0] = sn.x, sv[1] = sn.y, sv[2] = sn.z, sv[3] = sn.w;
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const int d = d0 + k;
          if (d < rot) {
            const int f = d < half ? d : d - half;
            cv[k] = cs[f], sv[k] = cs[half + f];
          }
        }
      }
    }
  }

  if (transform) {
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kVec; ++k) ss += x[k] * x[k];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    // No norm weights (Llama-style q/k): rope only.
    if (w) {
      const float inv = rsqrtf(ss / float(dim) + p.eps);
#pragma unroll
      for (int k = 0; k < kVec; ++k) x[k] = x[k] * inv * (1.f + wv[k]);
    }
    if (on)
#pragma unroll
      for (int k = 0; k < kVec; ++k) xs[warp][d0 + k] = x[k];
    __syncwarp();
    if (on)
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int d = d0 + k;
        if (d < rot)
          x[k] = d < half ? x[k] * cv[k] - xs[warp][d + half] * sv[k] : x[k] * cv[k] + xs[warp][d - half] * sv[k];
      }
  }

  // q and index_q: back in place, in the activation dtype.
  if (kind == kQ || kind == kIq) {
    if (on) store4(p.qkv, row + d0, a.act_bf16 ? DType::BF16 : DType::F32, a.vec_rows, x);
    return;
  }
  if (slot < 0) return;
  if (kind == kIk) {
    if (!a.write_index || !on) return;
    const auto& ic = p.index_cache;
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = round_bf16(x[k]);
    store4(ic.k, slot * ic.index_dim + d0, ic.dtype, a.vec_cache, x);  // [num_blocks, block_size, dim]
    return;
  }
  const auto& kv = p.kv;
  int64_t blk, off;
  if (a.slot32) {
    const uint32_t s32 = uint32_t(slot), bs = uint32_t(kv.block_size);
    blk = s32 / bs, off = s32 - uint32_t(blk) * bs;
  } else {
    blk = slot / kv.block_size, off = slot % kv.block_size;
  }
  const int64_t tok_head = (blk * kv.num_kv_heads + head) * kv.block_size + off;
  void* dst = kind == kK ? kv.k : kv.v;
#pragma unroll
  for (int k = 0; k < kVec; ++k) x[k] = round_bf16(x[k]);
  if (kv.dtype == DType::FP8_E4M3) {
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < kVec; ++k) amax = fmaxf(amax, fabsf(x[k]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax > 0.f ? amax / 448.f : 1.f;
    if (lane == 0) (kind == kK ? kv.k_scale : kv.v_scale)[tok_head] = scale;
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = x[k] / scale;
  }
  if (on) store4(dst, tok_head * kv.head_dim + d0, kv.dtype, a.vec_cache, x);
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
  if (!p.q_norm != !p.k_norm) return false;
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
  if (p.num_tokens > int64_t(0x7fffffff)) return false;
  auto aligned = [](const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  const size_t act_esz = a.act_bf16 ? 2 : 4;
  a.vec_rows = aligned(p.qkv, 4 * act_esz) && p.row_stride % 4 == 0 && p.q_offset % 4 == 0 &&
               p.k_offset % 4 == 0 && p.v_offset % 4 == 0 &&
               (!a.index || (p.index_q_offset % 4 == 0 && p.index_k_offset % 4 == 0));
  const size_t norm_esz = a.norm_bf16 ? 2 : 4;
  a.vec_norm = aligned(p.q_norm, 4 * norm_esz) && aligned(p.k_norm, 4 * norm_esz) &&
               (!a.index || (aligned(p.index_q_norm, 4 * norm_esz) && aligned(p.index_k_norm, 4 * norm_esz)));
  a.vec_cs = p.rotary_dim % 8 == 0 && aligned(p.cos_sin, 16);
  a.vec_cache = aligned(p.kv.k, 16) && aligned(p.kv.v, 16) && (!a.write_index || aligned(p.index_cache.k, 16));
  a.slot32 = p.kv.num_blocks * int64_t(p.kv.block_size) <= int64_t(0x7fffffff);
  const dim3 grid(unsigned(p.num_tokens), unsigned((a.jobs_per_token + kWarps - 1) / kWarps));
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  launch_pdl(cache_write_pdl(st, p.num_tokens), qkv_kernel, grid, kWarps * 32, 0, st, "qkv_norm_rope_cache", a);
  return true;
}

}  // namespace sieve::cuda
