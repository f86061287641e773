// Tensor-parallel tests' shared steps: one sequence through a runner, prefill then greedy decode.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/runner.h"

namespace sieve::testing {

constexpr int kBlocks = 6;

// One sequence in blocks 0, 1, ...: the prompt prefilled in chunks of `chunk`, then `decode`
// greedy tokens. Returns the log-probs of every prompt position and decode step; `greedy` gets
// the tokens chosen.
inline std::vector<float> run_sequence(engine::Runner& r, const std::vector<int32_t>& prompt,
                                       int chunk, int decode, std::vector<int32_t>* greedy) {
  const int bs = r.model().block_size();
  const int64_t V = r.model().vocab_size();
  std::vector<int32_t> table(kBlocks);
  for (int b = 0; b < kBlocks; ++b) table[size_t(b)] = b;
  std::vector<int32_t> ids = prompt;
  std::vector<float> out;
  auto step = [&](int begin, int end) {
    engine::StepInputs in;
    for (int p = begin; p < end; ++p) {
      in.token_ids.push_back(ids[size_t(p)]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(int64_t(table[size_t(p / bs)]) * bs + p % bs);
      in.logits_indices.push_back(p - begin);
    }
    in.query_start_loc = {0, end - begin};
    in.seq_lens = {end};
    in.block_tables = table;
    in.max_blocks_per_seq = kBlocks;
    std::vector<float> logits;
    r.run(in, logits);
    for (int64_t row = 0; row < end - begin; ++row) {
      const float* x = logits.data() + row * V;
      double mx = *std::max_element(x, x + V), sum = 0;
      for (int64_t i = 0; i < V; ++i) sum += std::exp(double(x[i]) - mx);
      for (int64_t i = 0; i < V; ++i) out.push_back(float(double(x[i]) - mx - std::log(sum)));
    }
    return logits;
  };
  const int n = int(prompt.size());
  std::vector<float> last;
  for (int at = 0; at < n; at += chunk) last = step(at, std::min(n, at + chunk));
  for (int i = 0; i < decode; ++i) {
    const float* x = last.data() + (last.size() / size_t(V) - 1) * size_t(V);
    const int32_t next = int32_t(std::max_element(x, x + V) - x);
    if (greedy) greedy->push_back(next);
    ids.push_back(next);
    last = step(int(ids.size()) - 1, int(ids.size()));
  }
  return out;
}

inline std::vector<int32_t> random_prompt(int n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(rng);
  return ids;
}

}  // namespace sieve::testing
