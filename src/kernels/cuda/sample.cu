// The sample op (ops.h) on CUDA: a step's token per logits row without copying the rows to the
// host. A row of a 200k vocabulary is split into chunks of kChunk columns (within one shard of the
// tensor-parallel layout), one CTA each, so that a batch of 32 rows fills the GPU: each chunk's
// largest value (first index), and for draws its weights' sum relative to its own maximum. One
// CTA per row then merges the chunks (the argmax; the draw's total rescaled to the row's
// maximum, the chunk where u * total falls) and rescans that one chunk with the exact weights of
// the rule for the id. Filtered rows (top-k, then min-p and top-p) take two kernels of their own:
// each chunk of kFChunk columns keeps its own top k by a radix select over (value, column) keys,
// and one CTA per row selects the row's top k from those, sorts them, and applies the rule in
// its order. Every kernel sizes its grid from the host's rows and vocabulary only, so the op can
// be captured in a CUDA graph.
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

// Chunk c of row r (chunks of kC columns): its first element, its length and its first column.
struct Span {
  const float* p;
  int n;
  int64_t col0;
};
template <int kC = kChunk>
__device__ __forceinline__ Span chunk_span(const Layout& l, int64_t r, int c) {
  const int s = c / l.chunks_per_shard;
  const int64_t k0 = int64_t(c % l.chunks_per_shard) * kC;
  Span sp;
  sp.n = int(min(int64_t(kC), l.vs - k0));
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

// Block-wide minimum over kT threads; every thread gets it.
template <int kT = kThreads>
__device__ int32_t block_min(int32_t x) {
  __shared__ int32_t s[kT / 32];
  for (int o = 16; o > 0; o >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = x;
  __syncthreads();
  int32_t m = s[0];
  for (int k = 1; k < kT / 32; ++k) m = min(m, s[k]);
  return m;
}

template <int kT = kThreads>
__device__ int32_t block_max(int32_t x) { return -block_min<kT>(-x); }

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
  if (sr.mode == int(ops::SampleMode::Filtered)) return;  // (filtered_pick_kernel's row)
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

// ---------------------------------------------------------------------------------------------
// Filtered rows (ops.h, SampleMode::Filtered)

constexpr int kFThreads = 512;
constexpr int kFPer = 16;
constexpr int kFChunk = kFThreads * kFPer;  // columns per CTA of filtered_chunks_kernel
constexpr int kFColBits = 13;               // a column within a chunk
static_assert(kFChunk == 1 << kFColBits);
constexpr int kMaxK = ops::kMaxDeviceTopK;
static_assert((kMaxK & (kMaxK - 1)) == 0 && kMaxK <= kFThreads, "the sort takes a power of two up to a block");

__device__ __forceinline__ int filtered_k(int32_t top_k, int64_t vocab) {
  const int64_t k = top_k < 1 ? 1 : top_k;
  const int64_t cap = vocab < kMaxK ? vocab : int64_t(kMaxK);
  return int(k < cap ? k : cap);
}

// Keys that order like the values (a NaN's key is meaningless: such rows give -1); -0 is +0.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = v == 0.0f ? 0u : __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// A warp's items add to a shared histogram, one atomic per distinct digit (logits crowd a few
// exponents: plain atomics would serialise on them). Every lane of the warp calls it.
__device__ __forceinline__ void hist_add(unsigned* hist, bool valid, unsigned digit) {
  if (!__any_sync(0xffffffffu, valid)) return;
  const unsigned peers = __match_any_sync(0xffffffffu, valid ? int(digit) : -1);
  if (valid && (threadIdx.x & 31) == unsigned(__ffs(peers) - 1)) atomicAdd(&hist[digit], unsigned(__popc(peers)));
}

// The top k of a block's distinct keys of `bits` bits are those with (key >> shift) >=
// (prefix >> shift).
struct Threshold {
  uint64_t prefix;
  int shift;
};
__device__ __forceinline__ bool in_top(uint64_t key, Threshold t) { return (key >> t.shift) >= (t.prefix >> t.shift); }

// Radix select, 8 bits a pass from the top, until the keys that share the chosen prefix are
// exactly the ones still needed. each(f) calls f(key, valid) for each of the thread's items, as
// many times on every lane of a warp; 1 <= k <= the valid items. (Equal keys, possible only in
// rows that give -1, can leave more than k keys in the top.)
template <class Each>
__device__ Threshold radix_select(const Each& each, int bits, int k) {
  __shared__ unsigned hist[256];
  __shared__ int s_sel[3];  // digit, count above it, count in it
  uint64_t prefix = 0;
  int rem = k, lo = bits;
  for (int hi = bits; hi > 0; hi = lo) {
    lo = max(hi - 8, 0);
    const unsigned digit_mask = (1u << (hi - lo)) - 1;
    // (Every thread has read the last pass's choice before the histogram is cleared.)
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    each([&](uint64_t key, bool valid) {
      const bool match = valid && (hi == bits || (key >> hi) == (prefix >> hi));
      hist_add(hist, match, unsigned(key >> lo) & digit_mask);
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane L holds bins 255 - 8L .. 248 - 8L; the first bin (from the top) where the count
      // reaches rem is the digit.
      const int lane = threadIdx.x;
      unsigned c[8], sum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += c[i] = hist[255 - 8 * lane - i];
      unsigned inc = sum;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
      }
      unsigned above = inc - sum;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (above < unsigned(rem) && above + c[i] >= unsigned(rem)) {
          s_sel[0] = 255 - 8 * lane - i;
          s_sel[1] = int(above);
          s_sel[2] = int(c[i]);
        }
        above += c[i];
      }
    }
    __syncthreads();
    prefix |= uint64_t(s_sel[0]) << lo;
    rem -= s_sel[1];
    if (s_sel[2] == rem) break;
  }
  return Threshold{prefix, lo};
}

// grid (rows, chunks of kFChunk): the chunk's top min(k, its length) as (value key << 32 |
// ~column) at cand[(r * chunks + c) * kMaxK ...], and whether it holds a NaN or +inf.
__global__ void __launch_bounds__(kFThreads, 2)
    filtered_chunks_kernel(Layout l, const ops::SampleRow* rows, int64_t vocab, uint64_t* cand, int32_t* bad,
                           int chunks) {
  const int64_t r = blockIdx.x;
  const int c = blockIdx.y;
  if (rows[r].mode != int(ops::SampleMode::Filtered)) return;
  const Span sp = chunk_span<kFChunk>(l, r, c);
  const int kk = min(filtered_k(rows[r].top_k, vocab), sp.n);
  uint32_t key[kFPer];
  bool odd = false;
#pragma unroll
  for (int j = 0; j < kFPer; ++j) {
    const int k = threadIdx.x + j * kFThreads;
    // (Past the chunk: key 0, below every value's key; the select never reaches it.)
    key[j] = 0;
    if (k < sp.n) {
      const float v = __ldg(sp.p + k);
      odd = odd || isnan(v) || v == -kNegInf;
      key[j] = order_key(v);
    }
  }
  odd = __syncthreads_or(odd);
  // Within the chunk: value, then the lower column first.
  auto each = [&](const auto& f) {
#pragma unroll
    for (int j = 0; j < kFPer; ++j) {
      const int k = threadIdx.x + j * kFThreads;
      f((uint64_t(key[j]) << kFColBits) | uint64_t(kFChunk - 1 - k), true);
    }
  };
  const Threshold t = radix_select(each, 32 + kFColBits, kk);
  __shared__ int s_n;
  if (threadIdx.x == 0) s_n = 0;
  __syncthreads();
  uint64_t* dst = cand + (r * chunks + c) * int64_t(kMaxK);
#pragma unroll
  for (int j = 0; j < kFPer; ++j) {
    const int k = threadIdx.x + j * kFThreads;
    if (in_top((uint64_t(key[j]) << kFColBits) | uint64_t(kFChunk - 1 - k), t)) {
      const int slot = atomicAdd(&s_n, 1);
      if (slot < kk) dst[slot] = (uint64_t(key[j]) << 32) | uint64_t(~uint32_t(sp.col0 + k));
    }
  }
  if (threadIdx.x == 0) bad[r * chunks + c] = odd;
}

// grid (rows): the row's top k of the chunks' candidates, sorted, and the rule's filters and draw
// in its order (ops.h), the sums in double on one thread as the CPU makes them.
__global__ void __launch_bounds__(kFThreads)
    filtered_pick_kernel(Layout l, const ops::SampleRow* rows, int64_t vocab, const uint64_t* cand,
                         const int32_t* bad, int chunks, const int32_t* id_map, int32_t* out) {
  __shared__ uint64_t s_c[kMaxK];  // the candidates, then sorted: value descending, ties to the lower id
  __shared__ double s_w[kMaxK], s_s[kMaxK], s_q[kMaxK];  // their weights, running sums, top-p shares
  __shared__ int s_n, s_keep;
  const int64_t r = blockIdx.x;
  const ops::SampleRow sr = rows[r];
  if (sr.mode != int(ops::SampleMode::Filtered)) return;
  const int k = filtered_k(sr.top_k, vocab);
  int odd = 0;
  for (int c = threadIdx.x; c < chunks; c += kFThreads) odd |= bad[r * chunks + c];
  if (__syncthreads_or(odd)) {
    if (threadIdx.x == 0) out[r] = -1;
    return;
  }
  // Candidate g: slot g % k of chunk g / k, when that chunk kept that many.
  const uint64_t* row_cand = cand + r * chunks * int64_t(kMaxK);
  const int items = chunks * k;
  auto each = [&](const auto& f) {
    for (int base = 0; base < items; base += kFThreads) {
      const int g = base + threadIdx.x;
      const int c = g / k, i = g - c * k;
      const bool valid =
          g < items && int64_t(i) < l.vs - int64_t(c % l.chunks_per_shard) * kFChunk;
      f(valid ? row_cand[int64_t(c) * kMaxK + i] : uint64_t(0), valid);
    }
  };
  const Threshold t = radix_select(each, 64, k);
  if (threadIdx.x == 0) s_n = 0;
  int P = 1;
  while (P < k) P <<= 1;
  for (int i = k + int(threadIdx.x); i < P; i += kFThreads) s_c[i] = 0;  // (sorts last)
  __syncthreads();
  each([&](uint64_t key, bool valid) {
    if (valid && in_top(key, t)) {
      const int slot = atomicAdd(&s_n, 1);
      if (slot < k) s_c[slot] = key;
    }
  });
  // Bitonic sort of P keys, descending.
  for (int size = 2; size <= P; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < P; i += kFThreads) {
        const int j = i ^ stride;
        if (j <= i) continue;
        const uint64_t a = s_c[i], b = s_c[j];
        if ((i & size) == 0 ? a < b : a > b) {
          s_c[i] = b;
          s_c[j] = a;
        }
      }
    }
  __syncthreads();
  // The rule's weights (no FMA: the CPU rounds the product, then the difference).
  const double inv_t = sr.inv_t;
  const double mx = __dmul_rn(double(key_value(uint32_t(s_c[0] >> 32))), inv_t);
  for (int i = threadIdx.x; i < k; i += kFThreads) {
    const float x = key_value(uint32_t(s_c[i] >> 32));
    s_w[i] = x == kNegInf ? 0.0 : exp(__dsub_rn(__dmul_rn(double(x), inv_t), mx));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double acc = 0;
    for (int i = 0; i < k; ++i) s_s[i] = acc = __dadd_rn(acc, s_w[i]);
  }
  // min-p: the first candidate below min_p times the first one's weight ends the prefix.
  int keep = k;
  if (sr.min_p > 0) {
    const double floor = __dmul_rn(sr.min_p, s_w[0]);
    int first = k;
    for (int i = threadIdx.x; i < k; i += kFThreads)
      if (!(s_w[i] >= floor)) first = min(first, i);
    keep = max(block_min<kFThreads>(first), 1);
  }
  __syncthreads();  // (s_s is written)
  // top-p: the shortest prefix whose share of the kept mass reaches top_p (the shares divided in
  // parallel, summed in order by one thread).
  if (sr.top_p < 1.0) {
    const double norm = s_s[keep - 1];
    for (int i = threadIdx.x; i < keep; i += kFThreads) s_q[i] = s_w[i] / norm;
    __syncthreads();
    if (threadIdx.x == 0) {
      double acc = 0;
      int n = 0;
      while (n < keep) {
        acc = __dadd_rn(acc, s_q[n]);
        ++n;
        if (acc >= sr.top_p) break;
      }
      s_keep = max(n, 1);
    }
    __syncthreads();
    keep = s_keep;
  }
  const double total = s_s[keep - 1];
  if (!(total > 0)) {
    if (threadIdx.x == 0) out[r] = -1;
    return;
  }
  // The draw: the first kept candidate with mass whose running sum exceeds u * total, else the
  // last one with mass.
  const double target = __dmul_rn(sr.u, total);
  int first = kNone, last = -1;
  for (int i = threadIdx.x; i < keep; i += kFThreads)
    if (s_w[i] > 0) {
      last = max(last, i);
      if (target < s_s[i]) first = min(first, i);
    }
  first = block_min<kFThreads>(first);
  last = block_max<kFThreads>(last);
  const int j = first != kNone ? first : last;
  if (threadIdx.x == 0) {
    const int32_t id = int32_t(~uint32_t(s_c[j]));
    out[r] = id_map ? id_map[id] : id;
  }
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
  Layout lf = l;
  lf.chunks_per_shard = int((l.vs + kFChunk - 1) / kFChunk);
  const int64_t fchunks = int64_t(lf.chunks_per_shard) * p.shards;
  const size_t smem = size_t(chunks) * sizeof(double);
  if (smem > 40 * 1024 || chunks > 65535 || p.rows > INT_MAX || fchunks * kMaxK > INT_MAX) return false;
  // Scratch: the partials, then the filtered rows' candidates and odd-value flags.
  const size_t part_bytes = (size_t(p.rows * chunks) * sizeof(Partial) + 255) / 256 * 256;
  const size_t cand_bytes = size_t(p.rows * fchunks) * kMaxK * sizeof(uint64_t);
  auto* base = static_cast<char*>(private_scratch(
      stream, kScratchSample, part_bytes + cand_bytes + size_t(p.rows * fchunks) * sizeof(int32_t)));
  auto* part = reinterpret_cast<Partial*>(base);
  auto* cand = reinterpret_cast<uint64_t*>(base + part_bytes);
  auto* bad = reinterpret_cast<int32_t*>(base + part_bytes + cand_bytes);
  sample_chunks_kernel<<<dim3(unsigned(p.rows), unsigned(chunks)), kThreads, 0, stream>>>(l, p.row, part, int(chunks));
  SIEVE_LAUNCH_CHECK("sample (chunks)");
  sample_pick_kernel<<<unsigned(p.rows), kThreads, smem, stream>>>(l, p.row, part, int(chunks), p.id_map, p.out);
  SIEVE_LAUNCH_CHECK("sample (pick)");
  // (sample_pick_kernel writes every row but the Filtered ones: without those, that is all.)
  if (!p.any_filtered) return true;
  filtered_chunks_kernel<<<dim3(unsigned(p.rows), unsigned(fchunks)), kFThreads, 0, stream>>>(lf, p.row, p.vocab, cand,
                                                                                            bad, int(fchunks));
  SIEVE_LAUNCH_CHECK("sample (filtered chunks)");
  filtered_pick_kernel<<<unsigned(p.rows), kFThreads, 0, stream>>>(lf, p.row, p.vocab, cand, bad, int(fchunks),
                                                                   p.id_map, p.out);
  SIEVE_LAUNCH_CHECK("sample (filtered pick)");
  return true;
}

}  // namespace sieve::cuda
