// Kernel benchmark (see bench.h). Each case builds several input sets on the device (caches,
// shuffled block tables, queries), enough that what its lightest row reads in one call, over
// all sets, exceeds 4x the L2, rotates through them, and
// times every launch with CUDA events (median of opt.iters after warm-up), eagerly and replayed
// from a CUDA graph.
#include <cuda_runtime.h>
#ifdef SIEVE_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/bench/bench.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/internal.h"

namespace sieve::kernels_bench {

using cuda::cuda_check;

namespace {

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
DevPtr dev(size_t n) { return std::make_unique<DevMem>(n); }
template <class T>
DevPtr upload(const std::vector<T>& v) {
  auto d = dev(v.size() * sizeof(T));
  cuda_check(cudaMemcpy(d->p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return d;
}

__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return float(x >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
}

// kind 0: bf16 in [-a, a]; 1: fp8 of [-a*448, a*448]; 2: f32 in [lo, lo + a]
__global__ void fill_kernel(void* p, int kind, size_t n, uint64_t seed, float a, float lo) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = hash_uniform(seed, i);
    if (kind == 0) static_cast<uint16_t*>(p)[i] = cuda::f32_to_bf16_bits(u * a);
    else if (kind == 1) static_cast<uint8_t*>(p)[i] = cuda::f32_to_fp8_bits(u * a * 448.f);
    else static_cast<float*>(p)[i] = lo + (u * 0.5f + 0.5f) * a;
  }
}
void fill(void* p, int kind, size_t n, uint64_t seed, float a = 1.f, float lo = 0.f) {
  fill_kernel<<<1024, 256>>>(p, kind, n, seed, a, lo);
  cuda_check(cudaGetLastError(), "fill");
}

__global__ void empty_kernel() {}

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
__global__ void __launch_bounds__(32) read_probe_kernel(ProbeRuns r, const int32_t* __restrict__ ids, int n, int per_cta,
                                                        int stages, unsigned* sink) {
  extern __shared__ __align__(128) uint8_t sm[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm);
  uint8_t* ring = sm + 128;
  const int i0 = blockIdx.x * per_cta, cnt = min(n, i0 + per_cta) - i0;
  if (threadIdx.x != 0 || cnt <= 0) return;
  for (int s = 0; s < stages; ++s) cuda::mbar_init(&bars[s], 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  const bool hinted = r.l2_first != 0;
  const uint64_t policy = hinted ? cuda::l2_policy_evict_first() : 0;
  auto issue = [&](int i) {
    const int s = i % stages;
    const int64_t id = __ldg(ids + i0 + i);
    cuda::mbar_expect_tx(&bars[s], r.item_bytes);
    uint32_t off = 0;
    for (int j = 0; j < r.runs; ++j) {
      cuda::bulk_copy_policy(ring + size_t(s) * r.item_bytes + off, r.base[j] + id * r.bytes[j], r.bytes[j],
                             &bars[s], hinted, policy);
      off += r.bytes[j];
    }
  };
  int issued = 0;
  for (; issued < min(cnt, stages); ++issued) issue(issued);
  unsigned acc = 0;
  for (int i = 0; i < cnt; ++i) {
    const int s = i % stages;
    cuda::mbar_wait(&bars[s], uint32_t(i / stages) & 1u);
    acc += *reinterpret_cast<volatile unsigned*>(ring + size_t(s) * r.item_bytes);
    if (issued < cnt) issue(issued++);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the reads observable
}

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
  std::function<void(int, cudaStream_t)> fn(bool l2_first = false) {
    for (ProbeRuns& r : runs) r.l2_first = l2_first;
    const uint32_t item = runs.at(0).item_bytes;
    const int n = int(ids.at(0)->bytes / sizeof(int32_t));
    for (const DevPtr& l : ids)
      if (l->bytes != ids[0]->bytes) throw Error("bench: read probe lists of different lengths");
    const int stages = std::clamp(int(73728 / item), 1, 3);
    const size_t smem = 128 + size_t(stages) * item;
    cuda_check(cudaFuncSetAttribute(read_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
               "read probe smem");
    int occ = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, read_probe_kernel, 32, smem), "read probe occupancy");
    const int ctas = std::max(1, std::min(n, std::clamp(occ, 1, 3) * cuda::num_sms()));
    const int per = (n + ctas - 1) / ctas;
    const int grid = std::max(1, (n + per - 1) / per);
    return [this, n, stages, per, grid, smem](int s, cudaStream_t st) {
      const size_t k = size_t(s) % runs.size();
      read_probe_kernel<<<grid, 32, smem, st>>>(runs[k], ids[k]->as<int32_t>(), n, per, stages, sink->as<unsigned>());
    };
  }
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.f : v[v.size() / 2];
}

// Times fn(set) over rotating sets, median in microseconds per call:
//  - batch 0, eager: CUDA events around each launch;
//  - graph (batch 1): one graph per set captured from fn and replayed, events around each
//    replay (launch overhead included, as for a lone kernel);
//  - graph with batch n > 1: one graph of n consecutive calls over the rotating sets (as the
//    kernels of consecutive layers run inside one decode-step graph), events around each
//    replay, divided by n (the per-call cost without the per-launch event and launch latency).
double time_it(int iters, int sets, const std::function<void(int, cudaStream_t)>& fn, bool graph,
               cudaStream_t stream, int batch = 1) {
  std::vector<cudaGraphExec_t> execs;
  if (graph) {
    const int ngraphs = batch > 1 ? 1 : sets;
    for (int s = 0; s < sets; ++s) fn(s, stream);  // sizes the workspace outside capture
    for (int gi = 0; gi < ngraphs; ++gi) {
      cudaGraph_t g;
      cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
      if (batch > 1) {
        for (int i = 0; i < batch; ++i) fn(i % sets, stream);
      } else {
        fn(gi, stream);
      }
      cuda_check(cudaStreamEndCapture(stream, &g), "end capture");
      cudaGraphExec_t e;
      cuda_check(cudaGraphInstantiate(&e, g, 0), "instantiate");
      cudaGraphDestroy(g);
      execs.push_back(e);
    }
  }
  auto launch = [&](int i) {
    if (graph) cuda_check(cudaGraphLaunch(execs[size_t(i) % execs.size()], stream), "graph launch");
    else fn(i % sets, stream);
  };
  for (int i = 0; i < std::max(10, sets * 2); ++i) launch(i);
  std::vector<cudaEvent_t> ev(size_t(iters) * 2);
  for (auto& e : ev) cuda_check(cudaEventCreate(&e), "event");
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(ev[size_t(2 * i)], stream);
    launch(i);
    cudaEventRecord(ev[size_t(2 * i + 1)], stream);
  }
  cuda_check(cudaStreamSynchronize(stream), "bench sync");
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(2 * i)], ev[size_t(2 * i + 1)]);
  for (auto& e : ev) cudaEventDestroy(e);
  for (auto& e : execs) cudaGraphExecDestroy(e);
  return double(median(ms)) * 1000.0 / (graph && batch > 1 ? batch : 1);
}

// Runs fn over the sets for `ms` milliseconds: after the host-side setup of a decode case (the GPU
// idles meanwhile) the case's first row, a few microseconds a call, read up to 2 us high (b1
// ctx9216 fp8: 10.1-10.3 against 8.0-8.3 in the rows after it). Long kernels are left as they
// were: 20 ms of sustained prefill work before a row measured them 2-7 % slower.
void warm_up(int sets, const std::function<void(int, cudaStream_t)>& fn, cudaStream_t stream, int ms) {
  int i = 0;
  for (const auto t0 = std::chrono::steady_clock::now();
       std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(ms);) {
    for (int k = 0; k < 10; ++k, ++i) fn(i % sets, stream);
    cuda_check(cudaStreamSynchronize(stream), "bench warm-up");
  }
}

// Calls per graph in the batched graph mode.
constexpr int kGraphBatch = 16;
const std::string kBatchMode = "graph x" + std::to_string(kGraphBatch) + " (per call)";

// ---------------------------------------------------------------------------------------------
// The cache write of one TP4 rank of MiniMax-M3 (16 q heads, 1 kv head, 1 index head, head dim
// 128, RoPE on 64 dims) over bf16 projection rows [q 16 x 128 | k | v | index q | index k].

constexpr int64_t kQkvStride = 16 * 128 + 4 * 128;

// `norm` serves as all four norm weights.
ops::QkvNormRopeCacheParams qkv_params(void* rows, int64_t tokens, const void* norm, const int32_t* positions,
                                       const float* cos_sin, const int64_t* slots, const ops::KvCacheView& kv,
                                       const ops::IndexCacheView& ic) {
  ops::QkvNormRopeCacheParams p;
  p.qkv = rows;
  p.act_dtype = DType::BF16;
  p.num_tokens = tokens;
  p.row_stride = kQkvStride;
  p.num_q_heads = 16, p.num_kv_heads = 1, p.head_dim = 128;
  p.q_offset = 0, p.k_offset = 2048, p.v_offset = 2176;
  p.num_index_heads = 1, p.index_dim = 128, p.index_q_offset = 2304, p.index_k_offset = 2432;
  p.q_norm = p.k_norm = p.index_q_norm = p.index_k_norm = norm;
  p.positions = positions;
  p.cos_sin = cos_sin;
  p.rotary_dim = 64;
  p.slot_mapping = slots;
  p.kv = kv;
  p.index_cache = ic;
  return p;
}

// Bytes it must move: the rows read once, q + index q written back, k, v and the index key
// cached (+ the fp8 scales). A dense layer's (`index` false): q, k and v read, q written back,
// k and v cached.
double qkv_bytes(int64_t tokens, bool fp8, bool index = true) {
  if (!index) return double(tokens) * ((2048 + 256) * 2.0 + 2048 * 2.0 + 2 * 128 * (fp8 ? 1 : 2) + (fp8 ? 8 : 0));
  return double(tokens) * (kQkvStride * 2.0 + (2048 + 128) * 2.0 + 3 * 128 * (fp8 ? 1 : 2) + (fp8 ? 8 : 0));
}

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
    p.q_stride = 16 * 128;
    p.out = st.out->p;
    p.out_dtype = DType::BF16;
    p.out_stride = 16 * 128;
    p.num_q_heads = 16;
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
    return attended_keys(sparse) * per_key + double(T) * 16 * 128 * 2 * 2;
  }
  double attn_flops(bool sparse) const { return attended_keys(sparse) * 16 * 128 * 4; }
  double index_flops() const { return attended_keys(false) * 128 * 2; }
};

std::string ctx_name(const BatchShape& s) {
  if (s.cached.size() == 1 && s.qlen[0] > 1)
    return std::to_string(s.qlen[0]) + " new" + (s.cached[0] ? " after " + std::to_string(s.cached[0]) : "");
  return "b" + std::to_string(s.cached.size()) + " ctx" + std::to_string(s.cached[0] + s.qlen[0]);
}

BatchShape decode_shape(int batch, int ctx) {
  BatchShape s;
  s.cached.assign(size_t(batch), ctx - 1);
  s.qlen.assign(size_t(batch), 1);
  return s;
}
BatchShape prefill_shape(int cached, int n) {
  BatchShape s;
  s.cached = {cached};
  s.qlen = {n};
  return s;
}

bool wanted(const Options& o, const std::string& what) {
  return o.filter.empty() || what.find(o.filter) != std::string::npos;
}
// --rows: a row (by its kernel name) is timed only when wanted.
bool row_wanted(const Options& o, const std::string& kernel) {
  return o.rows.empty() || kernel.find(o.rows) != std::string::npos;
}

// Kernel names of the rows whose --rows test comes before the row itself is built.
constexpr const char* kEmptyKernel = "empty kernel (timing floor)";
constexpr const char* kDecodeIndexer = "decode indexer";
constexpr const char* kFullDecodeStep = "decode step (cache write + indexer + sparse attention)";
constexpr const char* kDenseDecodeStep = "decode step (cache write + dense attention)";
// The read probe rows (read_probe_kernel): the bytes of each decode kernel, read and nothing else.
constexpr const char* kProbeIndexer = "read probe (decode indexer's bytes)";
constexpr const char* kProbeSparse = "read probe (sparse attention's bytes)";
constexpr const char* kProbeDense = "read probe (dense attention's bytes)";
constexpr const char* kCacheWrite = "qkv norm+rope+cache write";
constexpr const char* kMoe = "moe experts";

}  // namespace

Env measure_env() {
  Env e;
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  e.gpu = prop.name;
  e.sms = prop.multiProcessorCount;
  e.l2_mb = prop.l2CacheSize / 1048576.0;
  cudaStream_t st;
  cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  {
    const size_t n = size_t(2) << 30;  // 2 GiB copied: far past the L2
    DevMem a(n), b(n);
    fill(a.p, 2, n / 4, 1, 1.f, 0.f);
    const double us = time_it(20, 1, [&](int, cudaStream_t s) { cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice, s); }, false, st);
    e.copy_gbps = 2.0 * double(n) / (us * 1e-6) / 1e9;
  }
#ifdef SIEVE_HAVE_CUBLAS
  {
    const int N = 8192;
    DevMem A(size_t(N) * N * 2), B(size_t(N) * N * 2), C(size_t(N) * N * 2);
    fill(A.p, 0, size_t(N) * N, 11);
    fill(B.p, 0, size_t(N) * N, 12);
    cublasHandle_t h;
    if (cublasCreate(&h) == CUBLAS_STATUS_SUCCESS) {
      cublasSetStream(h, st);
      const float alpha = 1.f, beta = 0.f;
      const double us = time_it(20, 1, [&](int, cudaStream_t) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &alpha, A.p, CUDA_R_16BF, N, B.p, CUDA_R_16BF, N,
                     &beta, C.p, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      }, false, st);
      e.bf16_tflops = 2.0 * N * double(N) * N / (us * 1e-6) / 1e12;
      e.matrix_source = "cublas 8192^3 bf16, random data";
      cublasDestroy(h);
    }
  }
#endif
  if (e.bf16_tflops <= 0) {
    e.bf16_tflops = 790;
    e.matrix_source = "assumed (no cuBLAS in this build)";
  }
  cudaStreamDestroy(st);
  return e;
}

void run_all(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row) {
  cudaStream_t st;
  cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  const double l2 = env.l2_mb * 1048576.0;
  const double bw = env.copy_gbps * 1e9;
  const double rate = env.bf16_tflops * 1e12;
  const int iters = std::max(50, opt.iters);
  auto emit = [&](Row r, const Case& c) {
    r.runs = iters;
    r.input_sets = int(c.sets.size());
    on_row(r);
  };

  // ---- Calibration: what the timing method reads for a kernel that does nothing.
  if (row_wanted(opt, kEmptyKernel)) {
    Row r{kEmptyKernel, "1 CTA", "-", "eager", 0, 0, "-"};
    auto fn = [](int, cudaStream_t s) { empty_kernel<<<1, 32, 0, s>>>(); };
    r.us = time_it(iters, 1, fn, false, st);
    r.runs = iters, r.input_sets = 1;
    on_row(r);
    r.mode = "graph";
    r.us = time_it(iters, 1, fn, true, st);
    on_row(r);
    r.mode = kBatchMode;
    r.us = time_it(iters, 1, fn, true, st, kGraphBatch);
    on_row(r);
  }

  // ---- Decode.
  struct DShape {
    int batch, ctx;
  };
  const std::vector<DShape> dshapes = {{1, 9216}, {32, 9216}, {128, 9216}, {32, 32768}, {8, 131072}};
  for (bool fp8 : {true, false}) {
    const std::string dt = fp8 ? "fp8" : "bf16";
    for (const auto& ds : dshapes) {
      Case c;
      c.shape = decode_shape(ds.batch, ds.ctx);
      c.fp8 = fp8;
      const std::string shape = ctx_name(c.shape);
      if (!wanted(opt, "decode " + shape + " " + dt)) continue;
      c.build(uint64_t(ds.batch) * 7 + ds.ctx + fp8, l2);
      const int sets = int(c.sets.size());
      const bool main_shape = ds.batch == 32 && ds.ctx == 9216;
      // A row in the three timing modes (eager, one-call graph, batched graph); returns the last.
      auto emit_modes = [&](Row r, const std::function<void(int, cudaStream_t)>& fn) {
        r.mode = "eager";
        r.us = time_it(iters, sets, fn, false, st);
        emit(r, c);
        r.mode = "graph";
        r.us = time_it(iters, sets, fn, true, st);
        emit(r, c);
        r.mode = kBatchMode;
        r.us = time_it(iters, sets, fn, true, st, kGraphBatch);
        emit(r, c);
        return r;
      };
      // At the main shape, the batched-graph mode again with programmatic dependent launch of the
      // kernels in each mask (SIEVE_PDL's meaning; 0: plain launches) instead of the default
      // choice (same process, same inputs): what PDL gives.
      auto with_pdl = [&](Row r, const std::function<void(int, cudaStream_t)>& fn,
                          std::initializer_list<int> masks = {0, 7}) {
        if (!main_shape) return;
        const std::string mode = r.mode;
        r.target_us = 0, r.target_note = "";
        for (const int mask : masks) {
          cuda::set_pdl(mask);
          r.mode = mode + (mask ? ", PDL mask " + std::to_string(mask) : ", no PDL");
          r.us = time_it(iters, sets, fn, true, st, kGraphBatch);
          cuda::set_pdl(-1);
          emit(r, c);
        }
      };

      // Indexer: the default path (what run_indexer picks) with the targets, then the earlier
      // variants and the unfused baseline for comparison. A path that does not support the
      // shape is skipped.
      const double ifloor = c.index_bytes() / bw * 1e6;
      auto run_path = [&](cuda::IndexerPath path) {
        return [&c, path](int s, cudaStream_t stream) {
          if (!cuda::run_indexer_path(c.indexer(s), stream, path)) throw Error("bench: indexer unsupported");
        };
      };
      // A kernel's own rows launch it plainly (unless SIEVE_PDL chooses): with PDL, each call of
      // a graph of 16 would start under the one before, which a decode step does not give it. The
      // decode-step rows use the default PDL choice, as serving does.
      auto plain = [](const std::function<void(int, cudaStream_t)>& fn) {
        return [fn](int s, cudaStream_t stream) {
          if (cuda::pdl_env_set()) return fn(s, stream);
          cuda::set_pdl(0);
          fn(s, stream);
          cuda::set_pdl(-1);
        };
      };
      struct IPath {
        cuda::IndexerPath path;
        std::string name;
        bool target, eager;
      };
      const std::vector<IPath> ipaths = {{cuda::IndexerPath::kAuto, "fused (default)", true, true},
                                         {cuda::IndexerPath::kDecodeFused, "fused v1", false, false},
                                         {cuda::IndexerPath::kDecodeFusedV2, "fused v2", false, false},
                                         {cuda::IndexerPath::kDecodeFusedV3, "fused v3", false, false},
                                         {cuda::IndexerPath::kDecodeFusedV4, "fused v4", false, false},
                                         {cuda::IndexerPath::kDecodeBaseline, "baseline 3 kernels", false, false}};
      warm_up(sets, run_path(cuda::IndexerPath::kAuto), st, 20);
      for (const auto& ip : ipaths) {
        if (!row_wanted(opt, kDecodeIndexer)) break;
        if (!cuda::run_indexer_path(c.indexer(0), st, ip.path)) continue;
        Row r{kDecodeIndexer, shape, dt, "", 0, ifloor, "bytes"};
        if (ip.target) {
          r.target_us = main_shape ? (fp8 ? 12 : 22) : 1.4 * ifloor + 2;
          r.target_note = main_shape ? "issue target" : "1.4 x floor + 2 us";
        }
        if (ip.eager) {
          r.mode = ip.name + ", eager";
          r.us = time_it(iters, sets, plain(run_path(ip.path)), false, st);
          emit(r, c);
        }
        r.mode = ip.name + ", graph";
        r.us = time_it(iters, sets, plain(run_path(ip.path)), true, st);
        emit(r, c);
        r.mode = ip.name + ", " + kBatchMode;
        r.us = time_it(iters, sets, plain(run_path(ip.path)), true, st, kGraphBatch);
        emit(r, c);
        if (ip.target) with_pdl(r, run_path(ip.path));
      }
      // Every cache block of the batch, per set (the blocks of the indexer and of dense attention).
      auto all_blocks = [&c](int s) {
        std::vector<int32_t> ids;
        for (size_t i = 0; i < c.shape.cached.size(); ++i)
          for (int b = 0; b < (c.shape.cached[i] + c.shape.qlen[i] + 127) / 128; ++b)
            ids.push_back(c.sets[size_t(s)].host_tables[i * size_t(c.mbps) + size_t(b)]);
        return ids;
      };
      // The read probe of a kernel's blocks (graph x16 per call, as the rows it is set against).
      // Where the kernels stream these bytes with the L2 evict-first policy, a second row reads
      // them under it too.
      auto probe_row = [&](const char* kernel, ReadProbe& pr, double floor_us) {
        Row r{kernel, shape, dt, kBatchMode, 0, floor_us, "bytes"};
        r.us = time_it(iters, sets, pr.fn(false), true, st, kGraphBatch);
        emit(r, c);
        if (!pr.kernels_use_l2_first()) return;
        std::string name = kernel;
        name.insert(name.size() - 1, ", L2 evict-first");
        Row h{name, shape, dt, kBatchMode, 0, floor_us, "bytes"};
        h.us = time_it(iters, sets, pr.fn(true), true, st, kGraphBatch);
        emit(h, c);
      };
      const uint32_t kv_block = 128 * 128 * (fp8 ? 1 : 2);
      if (row_wanted(opt, kProbeIndexer)) {
        ReadProbe pr;
        for (int s = 0; s < sets; ++s) {
          pr.add(size_t(s), c.sets[size_t(s)].ic->p, kv_block);
          pr.ids.push_back(upload(all_blocks(s)));
        }
        probe_row(kProbeIndexer, pr, ifloor);
      }

      // Leave a real selection in every set for the attention.
      for (int s = 0; s < sets; ++s) run_path(cuda::IndexerPath::kAuto)(s, st);
      // K and V (and, fp8, their per-token scales) of a list of blocks, per set.
      auto kv_probe = [&](ReadProbe& pr, int s, const std::vector<int32_t>& ids) {
        const Set& set = c.sets[size_t(s)];
        pr.add(size_t(s), set.k->p, kv_block);
        pr.add(size_t(s), set.v->p, kv_block);
        if (fp8) {
          pr.add(size_t(s), set.ks->p, 128 * 4);
          pr.add(size_t(s), set.vs->p, 128 * 4);
        }
        pr.ids.push_back(upload(ids));
      };

      // Sparse attention.
      auto attn = [&c](bool sparse) {
        return [&c, sparse](int s, cudaStream_t stream) {
          if (!cuda::run_attention(c.attention(s, sparse), stream)) throw Error("bench: attention unsupported");
        };
      };
      const double afloor = c.attn_bytes(true) / bw * 1e6;
      Row a{"sparse decode attention", shape, dt, "", 0, afloor, "bytes"};
      a.target_us = main_shape ? (fp8 ? 7 : 11) : 0;
      a.target_note = main_shape ? "issue target" : "";
      if (row_wanted(opt, a.kernel)) with_pdl(emit_modes(a, plain(attn(true))), attn(true));
      if (row_wanted(opt, kProbeSparse)) {
        // The blocks each token's selection names (whole blocks: the own block's unused rows too).
        ReadProbe pr;
        cuda_check(cudaStreamSynchronize(st), "read probe selection");
        for (int s = 0; s < sets; ++s) {
          std::vector<int32_t> sel(size_t(c.T) * 16), ids;
          cuda_check(cudaMemcpy(sel.data(), c.sets[size_t(s)].topk->p, sel.size() * 4, cudaMemcpyDeviceToHost),
                     "read probe selection");
          for (size_t i = 0; i < c.shape.cached.size(); ++i)  // decode: token i is request i
            for (int k = 0; k < 16; ++k)
              if (const int b = sel[i * 16 + size_t(k)]; b >= 0)
                ids.push_back(c.sets[size_t(s)].host_tables[i * size_t(c.mbps) + size_t(b)]);
          kv_probe(pr, s, ids);
        }
        probe_row(kProbeSparse, pr, afloor);
      }

      // One decode step of a sparse layer: indexer + attention.
      auto step = [&](int s, cudaStream_t stream) {
        run_path(cuda::IndexerPath::kAuto)(s, stream);
        attn(true)(s, stream);
      };
      Row sr{"decode step (indexer + sparse attention)", shape, dt, "", 0, ifloor + afloor, "bytes"};
      if (row_wanted(opt, sr.kernel)) with_pdl(emit_modes(sr, step), step);

      // One decode step of a sparse layer's attention as the model runs it: the cache write of the
      // step's tokens (q / k / index q / index k norm + RoPE; K, V and the index key stored at
      // each request's new position), the indexer (its query vectors and the new keys from the
      // cache write), the sparse attention. Norm weights 0 (Gemma's 1 + w = 1), so repeating the
      // in-place transform keeps the rows' magnitudes.
      // The cache write's inputs per set (projection rows, positions, slots), built for the
      // decode-step rows that start with it.
      DevPtr d_cs, w;
      std::vector<DevPtr> rows, poss, slots;
      if (row_wanted(opt, kFullDecodeStep) || row_wanted(opt, kDenseDecodeStep)) {
        std::vector<float> cs(size_t(c.max_seq) * 64);
        ops::build_rope_table(cs.data(), c.max_seq, 64, 5e6);
        d_cs = upload(cs);
        w = dev(128 * 2);
        fill(w->p, 0, 128, 5, 0.f);
        for (int s = 0; s < sets; ++s) {
          std::vector<int32_t> pos;
          std::vector<int64_t> slot;
          for (size_t i = 0; i < c.shape.cached.size(); ++i)
            for (int j = 0; j < c.shape.qlen[i]; ++j) {
              const int p = c.shape.cached[i] + j;
              pos.push_back(p);
              slot.push_back(int64_t(c.sets[size_t(s)].host_tables[i * size_t(c.mbps) + size_t(p / 128)]) * 128 + p % 128);
            }
          rows.push_back(dev(size_t(c.T) * kQkvStride * 2));
          fill(rows.back()->p, 0, size_t(c.T) * kQkvStride, 60 + s, 2.f);
          poss.push_back(upload(pos));
          slots.push_back(upload(slot));
        }
        cuda_check(cudaDeviceSynchronize(), "bench inputs");
      }
      if (row_wanted(opt, kFullDecodeStep)) {
        auto full_step = [&](int s, cudaStream_t stream) {
          const ops::AttentionParams base = c.attention(s, true);
          ops::IndexerParams ip = c.indexer(s);
          const auto p = qkv_params(rows[size_t(s)]->p, c.T, w->p, poss[size_t(s)]->as<int32_t>(), d_cs->as<float>(),
                                    slots[size_t(s)]->as<int64_t>(), base.kv, ip.cache);
          if (!cuda::run_qkv_norm_rope_cache(p, stream)) throw Error("bench: cache write unsupported");
          ip.index_q = static_cast<uint16_t*>(rows[size_t(s)]->p) + p.index_q_offset;
          ip.q_stride = kQkvStride;
          if (!cuda::run_indexer_path(ip, stream, cuda::IndexerPath::kAuto)) throw Error("bench: indexer unsupported");
          ops::AttentionParams ap = base;
          ap.q = rows[size_t(s)]->p;
          ap.q_stride = kQkvStride;
          if (!cuda::run_attention(ap, stream)) throw Error("bench: attention unsupported");
        };
        Row fr{kFullDecodeStep, shape, dt, "", 0,
               ifloor + afloor + qkv_bytes(c.T, fp8) / bw * 1e6, "bytes"};
        fr = emit_modes(fr, full_step);
        with_pdl(fr, full_step, {0, 2, 7});  // 2: the indexer only
      }

      // Dense attention (dense layers).
      const double dfloor = c.attn_bytes(false) / bw * 1e6;
      Row d{"dense decode attention", shape, dt, "", 0, dfloor, "bytes"};
      d.target_us = main_shape ? 1.3 * dfloor : 0;
      d.target_note = main_shape ? "1.3 x floor" : "";
      if (row_wanted(opt, d.kernel)) with_pdl(emit_modes(d, plain(attn(false))), attn(false));
      if (row_wanted(opt, kProbeDense)) {
        ReadProbe pr;
        for (int s = 0; s < sets; ++s) kv_probe(pr, s, all_blocks(s));
        probe_row(kProbeDense, pr, dfloor);
      }

      // One decode step of a dense layer's attention: the cache write (q / k norm + RoPE; K and V
      // stored at each request's new position; no index key), then dense attention over the
      // cache that now holds the new tokens.
      if (row_wanted(opt, kDenseDecodeStep)) {
        auto dense_step = [&](int s, cudaStream_t stream) {
          const ops::AttentionParams base = c.attention(s, false);
          auto p = qkv_params(rows[size_t(s)]->p, c.T, w->p, poss[size_t(s)]->as<int32_t>(), d_cs->as<float>(),
                              slots[size_t(s)]->as<int64_t>(), base.kv, ops::IndexCacheView{});
          p.num_index_heads = 0, p.index_dim = 0;
          if (!cuda::run_qkv_norm_rope_cache(p, stream)) throw Error("bench: cache write unsupported");
          ops::AttentionParams ap = base;
          ap.q = rows[size_t(s)]->p;
          ap.q_stride = kQkvStride;
          if (!cuda::run_attention(ap, stream)) throw Error("bench: attention unsupported");
        };
        Row dr{kDenseDecodeStep, shape, dt, "", 0, dfloor + qkv_bytes(c.T, fp8, false) / bw * 1e6, "bytes"};
        dr = emit_modes(dr, dense_step);
        with_pdl(dr, dense_step, {0, 4, 7});  // 4: attention only
      }
    }
  }

  // ---- Prefill.
  struct PShape {
    int cached, n;
  };
  for (const auto& ps : std::vector<PShape>{{0, 8192}, {0, 32768}, {57344, 8192}}) {
    for (bool fp8 : {false, true}) {
      Case c;
      c.shape = prefill_shape(ps.cached, ps.n);
      c.fp8 = fp8;
      const std::string dt = fp8 ? "fp8" : "bf16";
      const std::string shape = ctx_name(c.shape);
      if (!wanted(opt, "prefill " + shape + " " + dt)) continue;
      if (fp8 && !(ps.cached == 0 && ps.n == 8192)) continue;  // fp8 prefill: one shape
      c.build(uint64_t(ps.cached) + ps.n + fp8, l2);
      const int sets = int(c.sets.size());
      const double ifl = c.index_flops() / rate * 1e6;
      Row r{"prefill indexer", shape, dt, "eager", 0, ifl, "flops"};
      const bool index_rows = row_wanted(opt, r.kernel);
      if (!fp8 && ps.cached == 0) {
        r.target_us = ps.n == 8192 ? 35 : 280;
        r.target_note = "issue target";
      }
      auto prefill_fn = [&](int s, cudaStream_t stream) {
        if (!cuda::run_indexer_path(c.indexer(s), stream, cuda::IndexerPath::kPrefill))
          throw Error("bench: indexer");
      };
      if (index_rows) {
        r.us = time_it(iters, sets, prefill_fn, false, st);
        emit(r, c);
        // The same call as a one-call CUDA graph: the kernels' time without the host's launch
        // calls (an eager call pays them inside its events: the empty kernel's eager row).
        r.mode = "graph";
        r.us = time_it(iters, sets, prefill_fn, true, st);
        emit(r, c);
        {
          // The same graph with the selection kernel waiting for the whole scoring grid.
          cuda::PrefillV2Knobs k;
          k.overlap = 0;
          cuda::set_indexer_prefill_v2_knobs(k);
          Row o = r;
          o.mode = "graph, selection not overlapped";
          o.target_us = 0, o.target_note = "";
          o.us = time_it(iters, sets, prefill_fn, true, st);
          cuda::set_indexer_prefill_v2_knobs(cuda::PrefillV2Knobs{});
          emit(o, c);
        }
        r.mode = "eager, first kernel";
        r.target_us = 0, r.target_note = "";
        r.us = time_it(
            std::min(iters, 50), sets,
            [&](int s, cudaStream_t stream) {
              if (!cuda::run_indexer_path(c.indexer(s), stream, cuda::IndexerPath::kPrefillV1))
                throw Error("bench: indexer");
            },
            false, st);
        emit(r, c);
      }
      for (int s = 0; s < sets; ++s) cuda::run_indexer(c.indexer(s), st);
      const double afl = c.attn_flops(true) / rate * 1e6;
      Row a{"sparse prefill attention", shape, dt, "eager", 0, afl, "flops"};
      if (!fp8 && ps.cached == 0 && ps.n == 8192) {
        a.target_us = afl * 2;
        a.target_note = ">= 50% of bf16 matrix rate";
      }
      auto attn_fn = [&](bool sparse) {
        return [&c, sparse](int s, cudaStream_t stream) { cuda::run_attention(c.attention(s, sparse), stream); };
      };
      if (row_wanted(opt, a.kernel)) {
        a.us = time_it(iters, sets, attn_fn(true), false, st);
        emit(a, c);
        if (ps.n == 8192 && ps.cached == 0) {
          // The decode kernel (one row per token and kv head, its blocks streamed from L2): the
          // gain of the tiles that share K/V blocks.
          Row o = a;
          o.mode = "eager, per-token kernel";
          o.target_us = 0, o.target_note = "";
          cuda::set_attention_prefill_kernel(0);
          o.us = time_it(std::min(iters, 50), sets, attn_fn(true), false, st);
          cuda::set_attention_prefill_kernel(-1);
          emit(o, c);
        }
      }
      Row d{"dense prefill attention", shape, dt, "eager", 0, c.attn_flops(false) / rate * 1e6, "flops"};
      if (!row_wanted(opt, d.kernel)) continue;
      d.us = time_it(iters, sets, attn_fn(false), false, st);
      emit(d, c);
      if (ps.n == 8192 && ps.cached == 0) {
        d.mode = "eager, per-token kernel";
        cuda::set_attention_prefill_kernel(0);
        d.us = time_it(std::min(iters, 50), sets, attn_fn(false), false, st);
        cuda::set_attention_prefill_kernel(-1);
        emit(d, c);
      }
    }
  }

  // ---- Cache write (qkv norm + RoPE + KV/index cache), decode b32 and prefill 8192.
  for (int tokens : {32, 8192}) {
    for (bool fp8 : {true, false}) {
      const std::string dt = fp8 ? "fp8" : "bf16";
      const std::string shape = std::to_string(tokens) + " tokens";
      if (!wanted(opt, "cache write " + shape + " " + dt) || !row_wanted(opt, kCacheWrite)) continue;
      const int nsets = 4;
      std::vector<DevPtr> rows, kc, vc, ksc, vsc, icc;
      const size_t slots = size_t(tokens) * 4;
      std::vector<int64_t> slot_map(static_cast<size_t>(tokens));
      std::vector<int32_t> pos(static_cast<size_t>(tokens));
      for (int t = 0; t < tokens; ++t) slot_map[size_t(t)] = int64_t(t) * 3 % int64_t(slots), pos[size_t(t)] = t;
      auto d_slots = upload(slot_map), d_pos = upload(pos);
      std::vector<float> cs(size_t(tokens) * 64);
      ops::build_rope_table(cs.data(), tokens, 64, 5e6);
      auto d_cs = upload(cs);
      auto w = dev(128 * 2);
      fill(w->p, 0, 128, 5, 0.5f);
      for (int s = 0; s < nsets; ++s) {
        rows.push_back(dev(size_t(tokens) * kQkvStride * 2));
        fill(rows.back()->p, 0, size_t(tokens) * kQkvStride, 40 + s, 2.f);
        kc.push_back(dev(slots * 128 * (fp8 ? 1 : 2)));
        vc.push_back(dev(slots * 128 * (fp8 ? 1 : 2)));
        ksc.push_back(dev(slots * 4));
        vsc.push_back(dev(slots * 4));
        icc.push_back(dev(slots * 128 * (fp8 ? 1 : 2)));
      }
      auto params = [&](int s) {
        ops::KvCacheView kv;
        kv.k = kc[size_t(s)]->p, kv.v = vc[size_t(s)]->p;
        kv.k_scale = ksc[size_t(s)]->as<float>(), kv.v_scale = vsc[size_t(s)]->as<float>();
        kv.dtype = fp8 ? DType::FP8_E4M3 : DType::BF16;
        kv.num_blocks = int64_t(slots / 128), kv.block_size = 128, kv.num_kv_heads = 1, kv.head_dim = 128;
        ops::IndexCacheView ic;
        ic.k = icc[size_t(s)]->p;
        ic.dtype = kv.dtype;
        ic.num_blocks = kv.num_blocks, ic.block_size = 128, ic.index_dim = 128;
        return qkv_params(rows[size_t(s)]->p, tokens, w->p, d_pos->as<int32_t>(), d_cs->as<float>(),
                          d_slots->as<int64_t>(), kv, ic);
      };
      cuda_check(cudaDeviceSynchronize(), "bench inputs");
      Row r{kCacheWrite, shape, dt, "eager", 0, qkv_bytes(tokens, fp8) / bw * 1e6, "bytes"};
      r.us = time_it(iters, nsets, [&](int s, cudaStream_t stream) { cuda::run_qkv_norm_rope_cache(params(s), stream); }, false, st);
      r.runs = iters, r.input_sets = nsets;
      on_row(r);
      r.mode = "graph";
      r.us = time_it(iters, nsets, [&](int s, cudaStream_t stream) { cuda::run_qkv_norm_rope_cache(params(s), stream); }, true, st);
      on_row(r);
    }
  }
  // ---- MoE experts of one TP4 rank (hidden 6144, 768 intermediate units of each of 128 experts,
  // top-4, BF16 weights, fp32 activations as the model runs them): decode batches of 32 and 256
  // tokens and a batch of 1024, bound by the routed experts' weights, and a prefill of 8192
  // tokens, bound by its FLOPs. Tokens route to 4 distinct experts drawn uniformly. Tensor cores
  // (the default, with the tile size it picks) against the other tile size
  // (cuda::set_moe_tile_rows) and, at 32 and 8192 tokens, the fp32 SIMT products
  // (cuda::set_moe_force_simt).
  if (row_wanted(opt, kMoe)) {
    constexpr int64_t H = 6144, I = 768;
    constexpr int E = 128, K = 4;
    std::vector<DevPtr> gu, dn;
    std::vector<const void*> gu_p, dn_p;
    for (int e = 0; e < E; ++e) {
      gu.push_back(dev(size_t(2 * I * H) * 2));
      dn.push_back(dev(size_t(H * I) * 2));
      fill(gu.back()->p, 0, size_t(2 * I * H), 900 + e, 0.02f);
      fill(dn.back()->p, 0, size_t(H * I), 1900 + e, 0.02f);
      gu_p.push_back(gu.back()->p);
      dn_p.push_back(dn.back()->p);
    }
    auto d_gu = upload(gu_p), d_dn = upload(dn_p);
    std::mt19937 rng(77);
    for (int tokens : {32, 256, 1024, 8192}) {
      const std::string shape = std::to_string(tokens) + " tokens";
      if (!wanted(opt, "moe " + shape + " bf16")) continue;
      std::vector<int32_t> ids(size_t(tokens) * K);
      std::vector<float> wts(ids.size());
      std::vector<char> used(E, 0);
      for (int t = 0; t < tokens; ++t) {
        std::vector<int32_t> perm(E);
        std::iota(perm.begin(), perm.end(), 0);
        for (int j = 0; j < K; ++j) {
          std::swap(perm[size_t(j)], perm[size_t(j) + rng() % size_t(E - j)]);
          ids[size_t(t) * K + size_t(j)] = perm[size_t(j)];
          wts[size_t(t) * K + size_t(j)] = 0.25f;
          used[size_t(perm[size_t(j)])] = 1;
        }
      }
      const double experts = double(std::count(used.begin(), used.end(), 1));
      auto d_ids = upload(ids), d_w = upload(wts);
      auto x = dev(size_t(tokens * H) * 4), out = dev(size_t(tokens * H) * 4);
      fill(x->p, 2, size_t(tokens * H), 31, 2.f, -1.f);
      fill(out->p, 2, size_t(tokens * H), 32, 2.f, -1.f);
      ops::MoeExpertsParams p;
      p.x = x->p;
      p.act_dtype = DType::F32;
      p.num_tokens = tokens, p.hidden = H, p.inter = I, p.num_experts = E, p.topk = K;
      p.ids = d_ids->as<int32_t>();
      p.weights = d_w->as<float>();
      p.w_gate_up = d_gu->as<const void*>();
      p.w_down = d_dn->as<const void*>();
      p.w_dtype = DType::BF16;
      p.out = out->p;
      cuda_check(cudaDeviceSynchronize(), "bench inputs");
      // Floor: the routed experts' weights once (and the rows in and out), or the products'
      // FLOPs, whichever takes longer.
      const double bytes = experts * double(3 * H * I) * 2 + double(tokens * H) * 4 * 3;
      const double flops = double(tokens) * K * 2.0 * 3.0 * double(H * I);
      const bool by_flops = flops / rate > bytes / bw;
      const double floor_us = (by_flops ? flops / rate : bytes / bw) * 1e6;
      auto fn = [&](int, cudaStream_t stream) { cuda::run_moe_experts(p, stream); };
      // The tile size moe_experts picks (16 rows up to 8 pairs an expert) and the other one.
      const int auto_rows = tokens * K <= 8 * E ? 16 : 64;
      for (int variant = 0; variant < 3; ++variant) {
        if (variant == 2 && tokens != 32 && tokens != 8192) continue;
        const bool simt = variant == 2;
        const int rows = variant == 1 ? 80 - auto_rows : 0;
        cuda::set_moe_force_simt(simt);
        cuda::set_moe_tile_rows(rows);
        const std::string mode = simt ? "simt fp32"
                                 : "tensor cores, " + std::to_string(rows ? rows : auto_rows) + "-row tiles" +
                                       (rows ? "" : " (default)");
        Row r{kMoe, shape, "bf16", mode, 0, floor_us, by_flops ? "flops" : "bytes"};
        r.runs = iters, r.input_sets = 1;
        r.us = time_it(simt && tokens > 32 ? std::min(iters, 10) : iters, 1, fn, false, st);
        if (simt && tokens > 32) r.runs = std::min(iters, 10);
        on_row(r);
        if (variant == 0) {
          r.mode = mode + ", graph";
          r.us = time_it(iters, 1, fn, true, st);
          on_row(r);
        }
      }
      cuda::set_moe_force_simt(false);
      cuda::set_moe_tile_rows(0);
    }
  }

  run_linear_rows(opt, env, on_row);
  cuda_check(cudaStreamSynchronize(st), "bench end");
  cudaStreamDestroy(st);
}

}  // namespace sieve::kernels_bench
