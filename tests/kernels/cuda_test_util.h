// Helpers of the CUDA parity tests (kernels_cuda_test.cpp, kernels_cuda_prefill_test.cpp):
// device buffers, a paged batch on the device, an indexer case with its CPU reference run, and
// the comparison of an indexer's outputs with the CPU reference's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/memory.h"
#include "kernels/ops.h"

namespace sieve::test {

inline const Device kGpu{DeviceKind::CUDA, 0};

#define SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

// Device copy of a host vector / byte buffer.
struct Dev {
  Buffer buf;
  explicit Dev(size_t bytes) : buf(kGpu, std::max<size_t>(bytes, 16)) {}
  template <class T>
  static Dev of(const std::vector<T>& v) {
    Dev d(v.size() * sizeof(T));
    if (!v.empty()) copy_to_device(kGpu, d.buf.data(), v.data(), v.size() * sizeof(T));
    return d;
  }
  static Dev of(const TypedBuffer& t) {
    Dev d(t.bytes.size());
    if (!t.bytes.empty()) copy_to_device(kGpu, d.buf.data(), t.bytes.data(), t.bytes.size());
    return d;
  }
  template <class T>
  T* as() const {
    return buf.as<T>();
  }
  void* p() const { return buf.data(); }
  template <class T>
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    if (n) copy_to_host(kGpu, v.data(), buf.data(), n * sizeof(T));
    return v;
  }
  std::vector<uint8_t> bytes(size_t n) const { return get<uint8_t>(n); }
  void poison(uint8_t v) { fill_bytes(kGpu, buf.data(), v, buf.bytes()); }
};

// Device copies of a paged batch's index arrays, and a BatchView over them.
struct DevBatch {
  Dev qsl, seq_lens, tables;
  ops::BatchView view;
  explicit DevBatch(const PagedBatch& b)
      : qsl(Dev::of(b.query_start_loc)), seq_lens(Dev::of(b.seq_lens)), tables(Dev::of(b.block_tables)) {
    view = b.view();
    view.query_start_loc = qsl.as<int32_t>();
    view.seq_lens = seq_lens.as<int32_t>();
    view.block_tables = tables.as<int32_t>();
  }
};

inline std::string name(DType t) { return std::string(dtype_name(t)); }

inline ops::Stream gpu_stream() {
  ops::Stream s;
  s.device = kGpu;
  return s;
}

// Host copy of a device buffer of `count` elements of `t`.
inline TypedBuffer fetch(const Dev& d, DType t, size_t count) {
  TypedBuffer b(t, count);
  b.bytes = d.bytes(count * dtype_size(t));
  return b;
}

// Compares a GPU indexer's outputs with the CPU reference's ([tokens, H, topk] ids and
// [tokens, H, mbps] block scores; gpu_scores null: not compared). Block scores within `stol`
// (exact when 0). Top-k: with exact ties (`ties`), the same ids in the same order; otherwise the
// same count, left-packed, no duplicates, any block the GPU picks that the CPU did not within
// tolerance of the CPU's k-th score, and `topk_equivalent` rank by rank. Reports at most 5
// failures.
inline void expect_indexer_matches(const PagedBatch& b, int H, int topk, const std::vector<int32_t>& cpu_idx,
                                   const std::vector<float>& cpu_scores, const std::vector<int32_t>& gpu_idx,
                                   const std::vector<float>* gpu_scores, bool ties, double stol) {
  const int64_t T = b.num_tokens;
  const int mbps = b.max_blocks_per_seq;
  int bad = 0;
  if (gpu_scores) {
    for (size_t i = 0; i < cpu_scores.size() && bad < 5; ++i) {
      const float cs = cpu_scores[i], gs = (*gpu_scores)[i];
      if (cs == gs) continue;
      if (!close(gs, cs, stol, stol)) {
        ADD_FAILURE() << "block score " << i << " (token " << i / (H * mbps) << ", head " << (i / mbps) % H
                      << ", block " << i % mbps << "): gpu " << gs << " cpu " << cs;
        ++bad;
      }
    }
  }
  auto ids = [](const std::vector<int32_t>& v) {
    std::string s;
    for (int x : v) s.append(" ").append(std::to_string(x));
    return s;
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      const size_t o = size_t((t * H + h) * topk);
      const float* srow = &cpu_scores[size_t((t * H + h) * mbps)];
      std::vector<int32_t> ci(cpu_idx.begin() + o, cpu_idx.begin() + o + topk);
      std::vector<int32_t> gi(gpu_idx.begin() + o, gpu_idx.begin() + o + topk);
      if (ties) {
        if (ci != gi && bad++ < 5)
          ADD_FAILURE() << "token " << t << " head " << h << ": top-k order differs: cpu" << ids(ci) << " | gpu"
                        << ids(gi);
        continue;
      }
      const int nc = int(std::count_if(ci.begin(), ci.end(), [](int v) { return v >= 0; }));
      const int ng = int(std::count_if(gi.begin(), gi.end(), [](int v) { return v >= 0; }));
      bool ok = nc == ng;
      for (int k = 0; k < topk && ok; ++k) ok = (k < ng) == (gi[size_t(k)] >= 0);  // left-packed
      std::set<int32_t> cs(ci.begin(), ci.begin() + nc), gs(gi.begin(), gi.begin() + std::max(ng, 0));
      ok = ok && int(gs.size()) == ng;  // no duplicates
      const float kth = nc > 0 ? srow[ci[size_t(nc - 1)]] : 0.f;
      for (int32_t id : gs) {
        if (!ok) break;
        if (id < 0 || id >= mbps) {
          ok = false;
          break;
        }
        if (!cs.count(id)) ok = std::fabs(srow[id] - kth) <= 1e-2 * std::max(1.f, std::fabs(kth)) + stol;
      }
      std::string why;
      if (ok && !topk_equivalent(srow, int(b.positions[size_t(t)] / 128 + 1), gi.data(), topk, stol + 1e-3, 1e-2,
                                 &why)) {
        ok = false;
      }
      if (!ok && bad++ < 5)
        ADD_FAILURE() << why << " token " << t << " head " << h << ": cpu" << ids(ci) << " | gpu" << ids(gi);
    }
  }
}

// Inputs of one indexer parity case.
struct IndexerInputs {
  std::vector<SeqSpec> specs;
  int H = 1;
  DType cache = DType::BF16;
  DType q_dtype = DType::BF16;
  int topk = 16, init = 0, local = 1;
  bool ties = false;  // cache and q on the grid {-1, -0.5, 0, 0.5, 1}: exact dots, many ties
  bool q_in_cache = false;
  int q_pad = 8;  // q row stride = H * 128 + q_pad elements (8: 16-byte aligned bf16 rows)

  std::string describe() const {
    return "cache " + name(cache) + " q " + name(q_dtype) + " H " + std::to_string(H) + " topk " +
           std::to_string(topk) + " init " + std::to_string(init) + " local " + std::to_string(local) +
           (ties ? " ties" : "");
  }
};

// An indexer case drawn from `seed` and run through the CPU reference (top-k [tokens, H, topk]
// and block scores [tokens, H, mbps]), with its inputs and output buffers on the device: `gpu` is
// the CPU run's parameters with every pointer on the device (outputs not poisoned yet).
struct IndexerRef {
  static constexpr int kDim = 128;
  Rng rng;
  PagedBatch b;
  IndexCache ic;
  TypedBuffer q;
  std::vector<int32_t> cpu_idx;
  std::vector<float> cpu_scores;
  DevBatch db;
  Dev d_q, d_cache, d_idx, d_scores;
  ops::IndexerParams gpu;
  bool ties;
  double stol;  // block-score tolerance: exact for ties, else fp32-accumulation close (q rounded
                // to bf16 on the GPU when it is given in fp32: docs/kernels.md)

  IndexerRef(const IndexerInputs& c, uint64_t seed)
      : rng(seed),
        b(make_paged_batch(c.specs, 128, rng)),
        ic(c.cache, b.num_blocks, 128, kDim),
        q(fill_cache_then_draw_q(c, b, ic, rng)),
        cpu_idx(size_t(b.num_tokens * c.H * c.topk), -7),
        cpu_scores(size_t(b.num_tokens * c.H * b.max_blocks_per_seq), kNaN),
        db(b),
        d_q(Dev::of(q)),
        d_cache(Dev::of(ic.k)),
        d_idx(cpu_idx.size() * 4),
        d_scores(cpu_scores.size() * 4),
        ties(c.ties),
        stol(c.ties ? 0 : (c.q_dtype == DType::F32 ? 2e-2 : 2e-4)) {
    ops::IndexerParams p;
    p.index_q = q.data();
    p.q_dtype = c.q_dtype;
    p.q_stride = int64_t(c.H) * kDim + c.q_pad;
    p.num_index_heads = c.H;
    p.index_dim = kDim;
    p.score_scale = float(1.0 / std::sqrt(128.0) * 1.4426950408889634);
    p.q_in_cache_dtype = c.q_in_cache;
    p.cache = ic.view();
    p.batch = b.view();
    p.topk = c.topk;
    p.init_blocks = c.init;
    p.local_blocks = c.local;
    p.topk_idx = cpu_idx.data();
    p.block_scores = cpu_scores.data();
    cpu::run_indexer(p);
    gpu = p;
    gpu.index_q = d_q.p();
    gpu.cache.k = d_cache.p();
    gpu.batch = db.view;
    gpu.topk_idx = d_idx.as<int32_t>();
    gpu.block_scores = d_scores.as<float>();
  }

  // The GPU run's outputs (block scores: compared only when `with_scores`) against the CPU's.
  void expect_gpu_matches(bool with_scores) const {
    const auto gpu_idx = d_idx.get<int32_t>(cpu_idx.size());
    const auto gpu_scores = with_scores ? d_scores.get<float>(cpu_scores.size()) : std::vector<float>{};
    expect_indexer_matches(b, gpu.num_index_heads, gpu.topk, cpu_idx, cpu_scores, gpu_idx,
                           with_scores ? &gpu_scores : nullptr, ties, stol);
  }

 private:
  static TypedBuffer fill_cache_then_draw_q(const IndexerInputs& c, const PagedBatch& b, IndexCache& ic, Rng& rng) {
    if (c.ties) {
      for (int s = 0; s < b.num_seqs(); ++s)
        for (int pos = 0; pos < b.seq_lens[size_t(s)]; ++pos) {
          std::vector<float> x(kDim);
          for (auto& v : x) v = rng.grid(2, 1);
          ic.write(b.slot(s, pos), x.data());
        }
    } else {
      fill_caches_random(b, nullptr, &ic, rng, 1.0f);
    }
    std::vector<float> qv(size_t(b.num_tokens * (int64_t(c.H) * kDim + c.q_pad)));
    for (auto& v : qv) v = c.ties ? rng.grid(2, 1) : rng.uniform(-1.f, 1.f);
    return TypedBuffer::from(c.q_dtype, qv);
  }
};

}  // namespace sieve::test
