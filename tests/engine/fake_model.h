// A stand-in for the model with the same paging contract: forward() stores each new token in its
// cache slot, and the logits of a row are a pseudo-random function of the whole sequence read
// back through the block table. A wrong slot mapping, block table, position or a block shared by
// mistake changes the logits, so engine outputs match a solo run only if paging is right.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"

namespace sieve::engine::testing {

class FakeModel : public model::Model {
 public:
  FakeModel(int64_t vocab, int block_size) {
    cfg_.vocab_size = vocab;
    cfg_.sparse_block_size = block_size;
    cfg_.use_sparse_attention = true;
  }
  const ModelConfig& config() const override { return cfg_; }
  const Device& device() const override { return dev_; }
  size_t cache_bytes_per_block(DType, DType) const override {
    return size_t(cfg_.sparse_block_size) * 16;
  }
  void allocate_caches(const model::CacheOptions& o) override {
    opts_ = o;
    slots_.assign(size_t((o.num_blocks + 1) * cfg_.sparse_block_size), -1);
  }
  void release_caches() override {
    opts_ = {};
    slots_.clear();
  }
  const model::CacheOptions& cache_options() const override { return opts_; }

  // The step's arrays are host memory: this model lives on the CPU.
  void forward(const model::StepView& step, const ops::Stream&) override {
    ++steps;
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us.load()));
    const int bs = cfg_.sparse_block_size;
    const ops::BatchView& b = step.batch;
    const size_t nseq = size_t(b.num_seqs);
    const size_t n = size_t(b.num_tokens);
    const int32_t* qsl = b.query_start_loc;
    const int mbps = b.max_blocks_per_seq;
    if (qsl[0] != 0 || size_t(qsl[nseq]) != n) throw std::runtime_error("inconsistent step inputs");
    for (size_t i = 0; i < n; ++i)
      if (step.token_ids[i] == fail_on_token) throw std::runtime_error("injected failure");
    for (size_t i = 0; i < n; ++i) {
      if (step.slot_mapping[i] < 0 || step.slot_mapping[i] >= int64_t(slots_.size()))
        throw std::runtime_error("bad slot");
      slots_[size_t(step.slot_mapping[i])] = step.token_ids[i];
    }
    for (size_t row = 0; row < step.logits_rows.size(); ++row) {
      const int32_t tok = step.logits_rows[row];
      size_t s = 0;
      while (s < nseq && qsl[s + 1] <= tok) ++s;
      if (s == nseq) throw std::runtime_error("logits index out of range");
      const int32_t pos = step.positions[size_t(tok)];
      if (pos != b.seq_lens[s] - (qsl[s + 1] - tok)) throw std::runtime_error("position mismatch");
      uint64_t h = 1469598103934665603ull;
      for (int32_t p = 0; p <= pos; ++p) {
        const int32_t blk = b.block_tables[s * size_t(mbps) + size_t(p / bs)];
        const int32_t t = slots_[size_t(int64_t(blk) * bs + p % bs)];
        if (t < 0) throw std::runtime_error("read of an unwritten cache slot");
        h = (h ^ uint64_t(uint32_t(t)) ^ (uint64_t(p) << 32)) * 1099511628211ull;
      }
      float* out = step.logits + row * size_t(cfg_.vocab_size);
      for (int64_t v = 0; v < cfg_.vocab_size; ++v) {
        uint64_t x = (h ^ uint64_t(v) * 0x9e3779b97f4a7c15ull);
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        out[v] = float(double(x >> 11) / double(1ull << 53) * 8.0 - 4.0);
      }
    }
  }

  std::atomic<int64_t> steps{0};
  std::atomic<int> delay_us{0};
  int32_t fail_on_token = -1;  // forward() throws when this token is fed (error handling tests)  //
                               // per step, to give other threads time to act mid-request

 private:
  ModelConfig cfg_;
  Device dev_;
  model::CacheOptions opts_;
  std::vector<int32_t> slots_;
};

// An EngineConfig from the fields the tests choose, the others at their defaults (a brace list
// would leave the later fields to -Wmissing-field-initializers).
inline EngineConfig engine_config(const SchedulerConfig& scheduler, int64_t num_blocks, bool prefix_caching = false,
                                  std::vector<int32_t> eos_ids = {}, std::optional<uint64_t> seed = std::nullopt) {
  EngineConfig c;
  c.scheduler = scheduler;
  c.num_blocks = num_blocks;
  c.enable_prefix_caching = prefix_caching;
  c.eos_ids = std::move(eos_ids);
  c.seed = seed;
  return c;
}

}  // namespace sieve::engine::testing
