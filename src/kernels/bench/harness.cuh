// The kernel benchmark's harness (kernels_bench.cu runs the cases): device buffers and their
// random contents, the input sets of a paged batch (caches, shuffled block tables, queries) and
// the parameters of each op over them, the floors' byte and FLOP counts, the read probe, and the
// timing of a call eagerly or from CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/internal.h"
#include "kernels/ops.h"

namespace sieve::kernels_bench {

using cuda::cuda_check;

struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevMem(size_t n) : bytes(n) { cuda_check(cudaMalloc(&p, std::max<size_t>(n, 16)), "cudaMalloc (bench)"); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};
using DevPtr = std::unique_ptr<DevMem>;
inline DevPtr dev(size_t n) { return std::make_unique<DevMem>(n); }
template <class T>
DevPtr upload(const std::vector<T>& v) {
  auto d = dev(v.size() * sizeof(T));
  cuda_check(cudaMemcpy(d->p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return d;
}

// Fills n elements at p on the device with a fixed pseudo-random sequence of `seed`. kind 0: bf16
// in [-a, a]; 1: fp8 of [-a*448, a*448]; 2: f32 in [lo, lo + a].
void fill(void* p, int kind, size_t n, uint64_t seed, float a = 1.f, float lo = 0.f);

// Read probe: the bytes a decode kernel must read and nothing else. Item i of the list is a block
// id; it stands for up to 4 runs, run j at base[j] + id * bytes[j]. Each CTA streams a
// contiguous share of the list through a ring of `stages` bulk copies into shared memory
// (one thread issues, then waits for each stage and reissues it), as the decode kernels' rings
// do, but with the list precomputed: no metadata loads before the first copy and no math.
// `l2_first`: the copies carry the L2 evict-first policy that the decode kernels use on the same
// stream (cuda::l2_evict_first).
struct ProbeRuns {
  const uint8_t* base[4];
  uint32_t bytes[4];
  int runs;
  uint32_t item_bytes;
  int l2_first;
};

// One probe call per set: that set's runs and item list. The grid read fastest on the H200
// (2026-12-04, docs/performance.md): up to 72 KB in flight a CTA (3 stages of 16 KB items, 2 of
// 32 KB, 1 of 64 KB), as many CTAs as fit three to an SM, the list split evenly.
struct ReadProbe {
  std::vector<ProbeRuns> runs;  // per set
  std::vector<DevPtr> ids;      // per set, the same number of items in each
  DevPtr sink = dev(64);
  // Adds a run of `bytes` a block at `base` to set s.
  void add(size_t s, const void* base, uint32_t bytes) {
    if (runs.size() <= s) runs.resize(s + 1);
    ProbeRuns& r = runs[s];
    r.base[r.runs] = static_cast<const uint8_t*>(base), r.bytes[r.runs] = bytes, r.item_bytes += bytes, ++r.runs;
  }
  // Whether the decode kernels stream these bytes with the L2 evict-first policy (the same rule).
  bool kernels_use_l2_first() const {
    return cuda::l2_evict_first(int64_t(ids.at(0)->bytes / sizeof(int32_t)) * runs.at(0).item_bytes, -1);
  }
  // One call of the probe for set s (graph-capturable); `l2_first`: under the L2 evict-first policy.
  std::function<void(int, cudaStream_t)> fn(bool l2_first = false);
};

// Times fn(set) over rotating sets, median in microseconds per call:
//  - batch 0, eager: CUDA events around each launch;
//  - graph (batch 1): one graph per set captured from fn and replayed, events around each
//    replay (launch overhead included, as for a lone kernel);
//  - graph with batch n > 1: one graph of n consecutive calls over the rotating sets (as the
//    kernels of consecutive layers run inside one decode-step graph), events around each
//    replay, divided by n (the per-call cost without the per-launch event and launch latency).
double time_it(int iters, int sets, const std::function<void(int, cudaStream_t)>& fn, bool graph,
               cudaStream_t stream, int batch = 1);
// Runs fn over the sets for `ms` milliseconds: after the host-side setup of a decode case (the GPU
// idles meanwhile) the case's first row, a few microseconds a call, read up to 2 us high (b1
// ctx9216 fp8: 10.1-10.3 against 8.0-8.3 in the rows after it). Long kernels are left as they
// were: 20 ms of sustained prefill work before a row measured them 2-7 % slower.
void warm_up(int sets, const std::function<void(int, cudaStream_t)>& fn, cudaStream_t stream, int ms);

// Calls per graph in the batched graph mode.
constexpr int kGraphBatch = 16;
inline const std::string kBatchMode = "graph x" + std::to_string(kGraphBatch) + " (per call)";

// ---------------------------------------------------------------------------------------------
// The cache write of one TP4 rank of MiniMax-M3 (16 q heads, 1 kv head, 1 index head, head dim
// 128, RoPE on 64 dims) over bf16 projection rows [q 16 x 128 | k | v | index q | index k].

constexpr int64_t kQkvStride = 16 * 128 + 4 * 128;

// `norm` serves as all four norm weights.
ops::QkvNormRopeCacheParams qkv_params(void* rows, int64_t tokens, const void* norm, const int32_t* positions,
                                       const float* cos_sin, const int64_t* slots, const ops::KvCacheView& kv,
                                       const ops::IndexCacheView& ic);
// Bytes it must move: the rows read once, q + index q written back, k, v and the index key
// cached (+ the fp8 scales). A dense layer's (`index` false): q, k and v read, q written back,
// k and v cached.
double qkv_bytes(int64_t tokens, bool fp8, bool index = true);

// ---------------------------------------------------------------------------------------------
// One input set of a paged batch: index cache, KV cache (+ scales), q, index_q, outputs.

struct BatchShape {
  std::vector<int> cached, qlen;  // per sequence
  int num_tokens() const { return std::accumulate(qlen.begin(), qlen.end(), 0); }
};

struct Set {
  DevPtr qsl, seq_lens, tables, ic, k, v, ks, vs, iq, q, topk, out;
  std::vector<int32_t> host_tables;
  ops::BatchView batch;
};

struct Case {
  BatchShape shape;
  bool fp8 = false;
  // Attention's q heads (one kv head): 16 at one TP4 rank, 8 at one TP8 rank (the q and out
  // buffers hold 16).
  int q_heads = 16;
  bool need_kv = true, need_index = true;
  int64_t blocks_per_set = 0;
  std::vector<Set> sets;
  int64_t T = 0;
  int max_seq = 0, mbps = 0;

  void build(uint64_t seed, double l2_bytes) {
    const int S = int(shape.cached.size());
    T = shape.num_tokens();
    std::vector<int32_t> qsl(1, 0), lens;
    for (int s = 0; s < S; ++s) {
      lens.push_back(shape.cached[s] + shape.qlen[s]);
      qsl.push_back(qsl.back() + shape.qlen[s]);
      max_seq = std::max(max_seq, lens.back());
      blocks_per_set += (lens.back() + 127) / 128;
    }
    mbps = (max_seq + 127) / 128;
    const size_t esz = fp8 ? 1 : 2;
    // Sets enough that the bytes the lightest row of the case reads in one call, rotated over
    // the sets, exceed 4 x the L2: the indexer reads every index block, sparse attention only the
    // K / V blocks its tokens select (at most 16 a token, at most the request's blocks).
    const double block_bytes = 128.0 * 128 * esz;
    double selected = 0;
    for (int s = 0; s < S; ++s) selected += std::min(16 * shape.qlen[size_t(s)], (lens[size_t(s)] + 127) / 128);
    double touched = double(blocks_per_set) * block_bytes * ((need_index ? 1 : 0) + (need_kv ? 2 : 0));
    if (need_index) touched = std::min(touched, double(blocks_per_set) * block_bytes);
    if (need_kv) touched = std::min(touched, selected * 2 * block_bytes);
    const int nsets = std::clamp(int(std::ceil(4.0 * l2_bytes / std::max(touched, 1.0))), 2, 16);
    std::mt19937_64 rng(seed);
    for (int si = 0; si < nsets; ++si) {
      Set st;
      std::vector<int32_t> phys(static_cast<size_t>(blocks_per_set));
      std::iota(phys.begin(), phys.end(), 0);
      std::shuffle(phys.begin(), phys.end(), rng);
      std::vector<int32_t> tables(size_t(S) * mbps, 0);
      size_t next = 0;
      for (int s = 0; s < S; ++s)
        for (int b = 0; b < (lens[s] + 127) / 128; ++b) tables[size_t(s) * mbps + b] = phys[next++];
      st.qsl = upload(qsl);
      st.seq_lens = upload(lens);
      st.tables = upload(tables);
      st.host_tables = tables;
      const size_t keys = size_t(blocks_per_set) * 128;
      const uint64_t sd = seed * 977 + si * 13;
      if (need_index) {
        st.ic = dev(keys * 128 * esz);
        fill(st.ic->p, fp8 ? 1 : 0, keys * 128, sd + 1, fp8 ? 0.25f : 1.f);
      }
      if (need_kv) {
        st.k = dev(keys * 128 * esz);
        st.v = dev(keys * 128 * esz);
        fill(st.k->p, fp8 ? 1 : 0, keys * 128, sd + 2, fp8 ? 0.9f : 1.f);
        fill(st.v->p, fp8 ? 1 : 0, keys * 128, sd + 3, fp8 ? 0.9f : 1.f);
        if (fp8) {
          st.ks = dev(keys * 4);
          st.vs = dev(keys * 4);
          fill(st.ks->p, 2, keys, sd + 4, 0.002f, 0.001f);
          fill(st.vs->p, 2, keys, sd + 5, 0.002f, 0.001f);
        }
      }
      st.iq = dev(size_t(T) * 128 * 2);
      fill(st.iq->p, 0, size_t(T) * 128, sd + 6);
      st.q = dev(size_t(T) * 16 * 128 * 2);
      fill(st.q->p, 0, size_t(T) * 16 * 128, sd + 7);
      st.topk = dev(size_t(T) * 16 * 4);
      st.out = dev(size_t(T) * 16 * 128 * 2);
      st.batch.num_seqs = S;
      st.batch.num_tokens = T;
      st.batch.query_start_loc = st.qsl->as<int32_t>();
      st.batch.seq_lens = st.seq_lens->as<int32_t>();
      st.batch.block_tables = st.tables->as<int32_t>();
      st.batch.max_blocks_per_seq = mbps;
      st.batch.max_seq_len = max_seq;
      st.batch.max_query_len = *std::max_element(shape.qlen.begin(), shape.qlen.end());
      sets.push_back(std::move(st));
    }
    cuda_check(cudaDeviceSynchronize(), "bench inputs");
  }

  ops::IndexerParams indexer(int si) const {
    const Set& st = sets[size_t(si)];
    ops::IndexerParams p;
    p.index_q = st.iq->p;
    p.q_dtype = DType::BF16;
    p.q_stride = 128;
    p.num_index_heads = 1;
    p.index_dim = 128;
    p.score_scale = float(1.0 / std::sqrt(128.0) * 1.4426950408889634);
    p.cache.k = st.ic ? st.ic->p : nullptr;
    p.cache.dtype = fp8 ? DType::FP8_E4M3 : DType::BF16;
    p.cache.num_blocks = blocks_per_set;
    p.cache.block_size = 128;
    p.cache.index_dim = 128;
    p.batch = st.batch;
    p.topk = 16;
    p.init_blocks = 0;
    p.local_blocks = 1;
    p.topk_idx = st.topk->as<int32_t>();
    return p;
  }
  ops::AttentionParams attention(int si, bool sparse) const {
    const Set& st = sets[size_t(si)];
    ops::AttentionParams p;
    p.q = st.q->p;
    p.q_dtype = DType::BF16;
    p.q_stride = int64_t(q_heads) * 128;
    p.out = st.out->p;
    p.out_dtype = DType::BF16;
    p.out_stride = int64_t(q_heads) * 128;
    p.num_q_heads = q_heads;
    p.num_kv_heads = 1;
    p.head_dim = 128;
    p.sm_scale = float(1.0 / std::sqrt(128.0));
    p.kv.k = st.k->p;
    p.kv.v = st.v->p;
    p.kv.k_scale = st.ks ? st.ks->as<float>() : nullptr;
    p.kv.v_scale = st.vs ? st.vs->as<float>() : nullptr;
    p.kv.dtype = fp8 ? DType::FP8_E4M3 : DType::BF16;
    p.kv.num_blocks = blocks_per_set;
    p.kv.block_size = 128;
    p.kv.num_kv_heads = 1;
    p.kv.head_dim = 128;
    p.batch = st.batch;
    p.topk_idx = sparse ? st.topk->as<int32_t>() : nullptr;
    p.topk = sparse ? 16 : 0;
    return p;
  }
  // Bytes and FLOPs that must be spent.
  double index_bytes() const {
    double keys = 0;
    for (size_t s = 0; s < shape.cached.size(); ++s) keys += shape.cached[s] + shape.qlen[s];
    return keys * 128 * (fp8 ? 1 : 2) + double(T) * 128 * 2 + double(T) * 16 * 4;
  }
  // Keys each new token attends to (sparse: its top-16 blocks, the own block partial).
  double attended_keys(bool sparse) const {
    double keys = 0;
    for (size_t s = 0; s < shape.cached.size(); ++s)
      for (int i = 0; i < shape.qlen[s]; ++i) {
        const int pos = shape.cached[s] + i;
        const int n_blk = pos / 128 + 1;
        keys += sparse ? double(std::min(16, n_blk) - 1) * 128 + (pos % 128 + 1) : pos + 1;
      }
    return keys;
  }
  double attn_bytes(bool sparse) const {
    // Decode: every attended key's K and V row (+ scales) once; q and out once.
    const double per_key = 2.0 * 128 * (fp8 ? 1 : 2) + (fp8 ? 8 : 0);
    return attended_keys(sparse) * per_key + double(T) * q_heads * 128 * 2 * 2;
  }
  double attn_flops(bool sparse) const { return attended_keys(sparse) * q_heads * 128 * 4; }
  double index_flops() const { return attended_keys(false) * 128 * 2; }
};

// The case name of a shape ("b32 ctx9216", "8192 new after 57344"), decode batches of `batch`
// requests at context `ctx`, and one prompt chunk of n tokens after `cached` ones.
std::string ctx_name(const BatchShape& s);
BatchShape decode_shape(int batch, int ctx);
BatchShape prefill_shape(int cached, int n);

}  // namespace sieve::kernels_bench
