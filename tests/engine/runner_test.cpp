#include "engine/runner.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "fake_model.h"
#include "kernels/cpu/cpu_ops.h"

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

// Two sequences: one wanting every row's logits (5 tokens), one its last row's (2 tokens).
static StepPlan two_sequence_plan() {
  StepPlan plan;
  plan.seqs.push_back(ScheduledSeq{1, {10, 11, 12, 13, 14}, 0, {4, 1}, true, true});
  plan.seqs.push_back(ScheduledSeq{2, {20, 21}, 0, {0}, true});
  plan.num_tokens = 7;
  return plan;
}

// The runner checks a step against the model's vocabulary and cache before anything runs, and
// hands back exactly the requested logits rows (on the CPU: no graphs).
TEST(Runner, RunsCheckedStepsAndReturnsTheirRows) {
  testing::FakeModel model(50, 4);
  model.allocate_caches({.num_blocks = 6});
  Runner runner(model);
  const StepPlan plan = two_sequence_plan();
  std::vector<int> row_seq;
  const StepInputs in = build_step_inputs(plan, 4, &row_seq);
  EXPECT_EQ(in.logits_indices, (std::vector<int32_t>{0, 1, 2, 3, 4, 6}));
  EXPECT_EQ(row_seq, (std::vector<int>{0, 0, 0, 0, 0, 1}));
  std::vector<float> logits;
  runner.run(in, logits);
  ASSERT_EQ(logits.size(), 6u * 50u);
  EXPECT_EQ(model.steps, 1);
  // Rows of different prefixes differ.
  EXPECT_NE(std::vector<float>(logits.begin(), logits.begin() + 50),
            std::vector<float>(logits.begin() + 50, logits.begin() + 100));

  StepInputs bad = in;
  bad.token_ids[3] = 50;  // outside the vocabulary
  EXPECT_THROW(runner.run(bad, logits), Error);
  bad = in;
  bad.block_tables[1] = 6;  // past the cache's blocks
  EXPECT_THROW(runner.run(bad, logits), Error);
  bad = in;
  bad.logits_indices.push_back(7);  // outside the batch
  EXPECT_THROW(runner.run(bad, logits), Error);
  bad = in;
  bad.seq_lens[1] = 1;  // fewer keys than new tokens
  EXPECT_THROW(runner.run(bad, logits), Error);
  EXPECT_EQ(model.steps, 1);  // none of them reached the model
  EXPECT_EQ(runner.graph_stats().captured + runner.graph_stats().replayed + runner.graph_stats().eager, 0);
}

// With row requests the runner returns the sample op's tokens and only the other rows' logits,
// compacted in order; the tokens are the host rule's on the full rows.
TEST(Runner, SamplesRowsAndReturnsOnlyTheRowsTheHostNeeds) {
  testing::FakeModel model(50, 4);
  model.allocate_caches({.num_blocks = 6});
  Runner runner(model);
  const StepPlan plan = two_sequence_plan();
  const StepInputs in = build_step_inputs(plan, 4);
  std::vector<float> full;
  runner.run(in, full);
  using M = ops::SampleMode;
  const M modes[6] = {M::Skip, M::Greedy, M::Draw, M::Skip, M::Filtered, M::Draw};
  std::vector<ops::SampleRow> rows(6);
  for (size_t i = 0; i < 6; ++i) rows[i] = {1.0 / 0.8, 0.1 + 0.15 * double(i), int32_t(modes[i]), 0};
  rows[4].top_k = 7;
  rows[4].top_p = 0.9;
  rows[4].min_p = 0.01;
  StepOutput out;
  runner.run(in, rows, out);
  ASSERT_EQ(out.tokens.size(), 6u);
  EXPECT_EQ(out.host_row, (std::vector<int32_t>{0, -1, -1, 1, -1, -1}));
  EXPECT_EQ(out.logits.size(), 2u * 50u);
  for (size_t i = 0; i < 6; ++i) {
    const float* x = full.data() + i * 50;
    if (modes[i] == M::Skip) {
      EXPECT_EQ(out.tokens[i], -1);
      EXPECT_EQ(std::vector<float>(out.row(i), out.row(i) + 50), std::vector<float>(x, x + 50)) << "row " << i;
    } else if (modes[i] == M::Greedy) {
      EXPECT_EQ(out.tokens[i], cpu::first_argmax(x, 50));
    } else if (modes[i] == M::Filtered) {
      EXPECT_GE(out.tokens[i], 0);
      EXPECT_EQ(out.tokens[i], cpu::filtered_draw(x, 50, rows[i]));
    } else {
      EXPECT_EQ(out.tokens[i], cpu::draw_row(x, 50, rows[i].inv_t, rows[i].u));
    }
  }
  // Off, every row comes to the host.
  RunnerOptions o;
  o.device_sampling = false;
  Runner host(model, o);
  StepOutput all;
  host.run(in, rows, all);
  EXPECT_EQ(all.tokens, std::vector<int32_t>(6, -1));
  EXPECT_EQ(std::vector<float>(all.logits.data(), all.logits.data() + all.logits.size()), full);
}

}  // namespace sieve::engine
