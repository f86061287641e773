#include "engine/runner.h"

#include <gtest/gtest.h>

namespace sieve::engine {

TEST(Runner, BuildsStepInputsFromAPlan) {
  StepPlan plan;
  // A prefill chunk of 3 tokens at positions 4..6 (not sampled) and a decode at position 9.
  plan.seqs.push_back(ScheduledSeq{1, {10, 11, 12}, 4, {7, 2}, false});
  plan.seqs.push_back(ScheduledSeq{2, {20}, 9, {5, 3, 8}, true});
  plan.num_tokens = 4;
  std::vector<int> sample_seq;
  auto in = build_step_inputs(plan, 4, &sample_seq);
  EXPECT_EQ(in.token_ids, (std::vector<int32_t>{10, 11, 12, 20}));
  EXPECT_EQ(in.positions, (std::vector<int32_t>{4, 5, 6, 9}));
  // pos 4..6 -> block index 1 (physical 2), offsets 0..2; pos 9 -> block index 2 (physical 8),
  // offset 1.
  EXPECT_EQ(in.slot_mapping, (std::vector<int64_t>{8, 9, 10, 33}));
  EXPECT_EQ(in.query_start_loc, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(in.seq_lens, (std::vector<int32_t>{7, 10}));
  EXPECT_EQ(in.max_blocks_per_seq, 3);
  EXPECT_EQ(in.block_tables, (std::vector<int32_t>{7, 2, 0, 5, 3, 8}));
  EXPECT_EQ(in.logits_indices, (std::vector<int32_t>{3}));
  EXPECT_EQ(sample_seq, (std::vector<int>{1}));
}

}  // namespace sieve::engine
