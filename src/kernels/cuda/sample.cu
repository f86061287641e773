// The sample op (ops.h) on CUDA: a step's token per logits row without copying the rows to the
// host. A row of a 200k vocabulary is split into chunks of kChunk columns (within one shard of the
// tensor-parallel layout), one CTA each, so that a batch of 32 rows fills the GPU: each chunk's
// largest value (first index), and for draws its weights' sum relative to its own maximum. One
// CTA per row then merges the chunks (the argmax; the draw's total rescaled to the row's
// maximum, the chunk where u * total falls) and rescans that one chunk with the exact weights of
// the rule for the id. Both kernels size their grids from the host's rows and vocabulary only,
// so the op can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace sieve::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kPer = 16;
constexpr int kChunk = kThreads * kPer;
constexpr int kWarps = kThreads / 32;
constexpr int32_t kNone = INT_MAX;  // no value above -inf (yet)

struct Partial {
  double sum;  // draws: sum of exp(x * inv_t - max * inv_t) over the chunk
  float max;   // the chunk's largest value (-inf: none)
  int32_t idx;  // its first column (kNone: none)
};

struct Layout {
  const float* x;
  int64_t rows, ld, vs;  // vs: columns per shard (the vocabulary when unsharded)
  int shards, chunks_per_shard;
};

// Chunk c of row r: its first element, its length and its first column.
struct Span {
  const float* p;
  int n;
  int64_t col0;
};
__device__ __forceinline__ Span chunk_span(const Layout& l, int64_t r, int c) {
  const int s = c / l.chunks_per_shard;
  const int64_t k0 = int64_t(c % l.chunks_per_shard) * kChunk;
  Span sp;
  sp.n = int(min(int64_t(kChunk), l.vs - k0));
  sp.col0 = int64_t(s) * l.vs + k0;
  sp.p = l.shards == 1 ? l.x + r * l.ld + k0 : l.x + (int64_t(s) * l.rows + r) * l.vs + k0;
  return sp;
}

__device__ __forceinline__ double weight(float x, double inv_t, double mx) {
  return x == kNegInf ? 0.0 : exp(double(x) * inv_t - mx);
}

// (v, i) becomes the better of itself and (ov, oi): the larger value, ties to the lower index.
__device__ __forceinline__ void better(float& v, int32_t& i, float ov, int32_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// Block-wide argmax; every thread gets the result.
__device__ void block_argmax(float& v, int32_t& i) {
  __shared__ float sv[kWarps];
  __shared__ int32_t si[kWarps];
  for (int o = 16; o > 0; o >>= 1) better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  const int w = threadIdx.x >> 5;
  __syncthreads();  // (the arrays may be read by an earlier call still)
  if ((threadIdx.x & 31) == 0) {
    sv[w] = v;
    si[w] = i;
  }
  __syncthreads();
  v = sv[0];
  i = si[0];
  for (int k = 1; k < kWarps; ++k) better(v, i, sv[k], si[k]);
}

__device__ double block_sum(double x) {
  __shared__ double s[kWarps];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = x;
  __syncthreads();
  double t = 0;
  for (int k = 0; k < kWarps; ++k) t += s[k];
  return t;
}

// Exclusive prefix sum over the block's threads in thread order.
__device__ double block_exclusive_scan(double x) {
  __shared__ double s[kWarps];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  double inc = x;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  __syncthreads();
  if (lane == 31) s[w] = inc;
  __syncthreads();
  double base = 0;
  for (int k = 0; k < w; ++k) base += s[k];
  return base + inc - x;
}

__device__ int32_t block_min(int32_t x) {
  __shared__ int32_t s[kWarps];
  for (int o = 16; o > 0; o >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = x;
  __syncthreads();
  int32_t m = s[0];
  for (int k = 1; k < kWarps; ++k) m = min(m, s[k]);
  return m;
}

__device__ int32_t block_max(int32_t x) { return -block_min(-x); }

// grid (rows, chunks): each chunk's argmax and, for draws, its weights' sum.
__global__ void __launch_bounds__(kThreads)
    sample_chunks_kernel(Layout l, const ops::SampleRow* rows, Partial* part, int chunks) {
  const int64_t r = blockIdx.x;
  const int c = blockIdx.y;
  const int mode = rows[r].mode;
  if (mode != int(ops::SampleMode::Greedy) && mode != int(ops::SampleMode::Draw)) return;
  const Span sp = chunk_span(l, r, c);
  float v[kPer];
  float best = kNegInf;
  int32_t bi = kNone;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int k = threadIdx.x + j * kThreads;
    v[j] = k < sp.n ? __ldg(sp.p + k) : kNegInf;
    if (v[j] > best) {
      best = v[j];
      bi = int32_t(sp.col0 + k);
    }
  }
  block_argmax(best, bi);
  double sum = 0;
  if (mode == int(ops::SampleMode::Draw)) {
    const double inv_t = rows[r].inv_t;
    const double m = double(best) * inv_t;  // = the largest scaled value (inv_t > 0 keeps the order)
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (threadIdx.x + j * kThreads < sp.n) sum += weight(v[j], inv_t, m);
    sum = block_sum(sum);
  }
  if (threadIdx.x == 0) part[r * chunks + c] = Partial{sum, best, bi};
}

// grid (rows): the chunks merged, and for draws the chosen chunk rescanned. Dynamic shared
// memory: a double per chunk.
__global__ void __launch_bounds__(kThreads)
    sample_pick_kernel(Layout l, const ops::SampleRow* rows, const Partial* part, int chunks,
                       const int32_t* id_map, int32_t* out) {
  extern __shared__ double scaled[];  // [chunks] each chunk's sum at the row's maximum
  __shared__ int s_chunk;
  __shared__ double s_before, s_target;
  const int64_t r = blockIdx.x;
  const ops::SampleRow sr = rows[r];
  if (sr.mode != int(ops::SampleMode::Greedy) && sr.mode != int(ops::SampleMode::Draw)) {
    if (threadIdx.x == 0) out[r] = -1;
    return;
  }
  const Partial* pr = part + r * chunks;
  float best = kNegInf;
  int32_t bi = kNone;
  for (int c = threadIdx.x; c < chunks; c += kThreads) better(best, bi, pr[c].max, pr[c].idx);
  block_argmax(best, bi);
  int32_t id = bi == kNone ? 0 : bi;
  if (sr.mode == int(ops::SampleMode::Draw)) {
    const double mx = double(best) * sr.inv_t;
    for (int c = threadIdx.x; c < chunks; c += kThreads) {
      const double s = pr[c].sum;
      // (A chunk without mass adds nothing, also when its maximum is -inf; NaN stays NaN.)
      scaled[c] = s != 0 ? s * exp(double(pr[c].max) * sr.inv_t - mx) : 0.0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double total = 0;
      for (int c = 0; c < chunks; ++c) total += scaled[c];
      int chosen = -1;
      double before = 0, acc = 0;
      if (total > 0) {
        const double target = sr.u * total;
        for (int c = 0; c < chunks; ++c) {
          if (!(scaled[c] > 0)) continue;
          before = acc;
          acc += scaled[c];
          chosen = c;
          if (target < acc) break;
        }
        s_target = target;
      }
      s_chunk = chosen;
      s_before = before;
    }
    __syncthreads();
    const int c = s_chunk;
    if (c < 0) {
      id = -1;
    } else {
      // The exact weights of the rule over the chosen chunk, summed on from the chunks before.
      const Span sp = chunk_span(l, r, c);
      const int k0 = threadIdx.x * kPer;
      double w[kPer], mine = 0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        w[j] = k0 + j < sp.n ? weight(sp.p[k0 + j], sr.inv_t, mx) : 0.0;
        mine += w[j];
      }
      double acc = s_before + block_exclusive_scan(mine);
      const double target = s_target;
      int32_t first = kNone, last = -1;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (!(w[j] > 0)) continue;
        acc += w[j];
        last = k0 + j;
        if (first == kNone && target < acc) first = k0 + j;
      }
      first = block_min(first);
      last = block_max(last);
      // (Rounding may leave the target past this chunk's last id: the rule's last-id case. A
      // chunk whose exact weights all underflow, which only rounding can pick, gives the argmax.)
      const int32_t k = first != kNone ? first : last;
      id = k >= 0 ? int32_t(sp.col0 + k) : bi;
    }
  }
  if (threadIdx.x == 0) out[r] = id >= 0 && id_map ? id_map[id] : id;
}

}  // namespace

bool run_sample(const ops::SampleParams& p, void* stream_v) {
  cpu::validate_sample(p);
  if (p.rows == 0) return true;
  const auto stream = static_cast<cudaStream_t>(stream_v);
  Layout l;
  l.x = p.logits;
  l.rows = p.rows;
  l.shards = p.shards;
  l.vs = p.vocab / p.shards;
  l.ld = p.ld > 0 ? p.ld : p.vocab;
  l.chunks_per_shard = int((l.vs + kChunk - 1) / kChunk);
  const int64_t chunks = int64_t(l.chunks_per_shard) * p.shards;
  const size_t smem = size_t(chunks) * sizeof(double);
  if (smem > 40 * 1024 || chunks > 65535 || p.rows > INT_MAX) return false;
  auto* part = static_cast<Partial*>(private_scratch(stream, kScratchSample, size_t(p.rows * chunks) * sizeof(Partial)));
  sample_chunks_kernel<<<dim3(unsigned(p.rows), unsigned(chunks)), kThreads, 0, stream>>>(l, p.row, part, int(chunks));
  SIEVE_LAUNCH_CHECK("sample (chunks)");
  sample_pick_kernel<<<unsigned(p.rows), kThreads, smem, stream>>>(l, p.row, part, int(chunks), p.id_map, p.out);
  SIEVE_LAUNCH_CHECK("sample (pick)");
  return true;
}

}  // namespace sieve::cuda
