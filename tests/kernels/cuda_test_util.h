// Helpers of the CUDA parity tests (kernels_cuda_test.cpp, kernels_cuda_prefill_test.cpp):
// device buffers, a paged batch on the device, and the comparison of an indexer's outputs with
// the CPU reference's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "kernel_test_util.h"
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

}  // namespace sieve::test
