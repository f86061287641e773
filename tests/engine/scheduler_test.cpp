// Scheduling policy with simulated requests and no model: the "model" appends token 7 to every
// sequence that samples.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>

namespace sieve::engine {
namespace {

struct Sim {
  cache::KvCacheManager kv;
  Scheduler sched;
  std::vector<std::unique_ptr<Request>> reqs;
  Sim(int64_t blocks, int block_size, SchedulerConfig cfg, bool caching = false)
      : kv(blocks, block_size, caching), sched(cfg, kv) {}

  Request* add(int prompt_len, int64_t max_tokens, int first_token = 100) {
    auto r = std::make_unique<Request>();
    r->id = reqs.size() + 1;
    r->tokens.resize(size_t(prompt_len));
    std::iota(r->tokens.begin(), r->tokens.end(), first_token);
    r->num_prompt_tokens = prompt_len;
    r->params.max_tokens = max_tokens;
    r->max_total_tokens = prompt_len + max_tokens;
    sched.add(r.get());
    reqs.push_back(std::move(r));
    return reqs.back().get();
  }
  Request* get(RequestId id) { return reqs[id - 1].get(); }
  // Runs one step; returns the plan.
  StepPlan step() {
    StepPlan plan = sched.schedule();
    std::vector<Request*> done;
    for (const auto& s : plan.seqs) {
      Request* r = get(s.request_id);
      // Every scheduled token has a slot in the table.
      EXPECT_GE(int64_t(s.block_table.size()) * kv.block_size(),
                s.start_pos + int64_t(s.token_ids.size()));
      if (s.sample) {
        r->tokens.push_back(7);
        if (r->num_output_tokens() >= r->params.max_tokens) done.push_back(r);
      }
    }
    sched.step_done(plan);
    for (Request* r : done) sched.finish(r);
    return plan;
  }
};

// A request collecting prompt log-probs gets every row of the chunks that cover prompt positions
// it lacks; its decode steps and other requests get the sampled row only.
TEST(Scheduler, PromptLogprobsAskForEveryRowOfTheirChunks) {
  Sim sim(100, 4, {.max_num_batched_tokens = 8, .max_num_seqs = 4, .max_model_len = 64});
  Request* r = sim.add(12, 2);
  r->params.prompt_logprobs = 1;
  sim.add(3, 2, 500);
  auto p1 = sim.step();
  ASSERT_EQ(p1.seqs.size(), 1u);
  EXPECT_TRUE(p1.seqs[0].all_logits);
  // The engine collected positions 1..8 from the first chunk.
  r->prompt_lp.resize(8);
  auto p2 = sim.step();
  ASSERT_EQ(p2.seqs.size(), 2u);
  EXPECT_TRUE(p2.seqs[0].all_logits);   // prompt tokens 8..11
  EXPECT_FALSE(p2.seqs[1].all_logits);  // no prompt_logprobs
  r->prompt_lp.resize(11);  // every prompt position
  auto p3 = sim.step();
  ASSERT_EQ(p3.seqs.size(), 2u);
  EXPECT_EQ(p3.seqs[0].token_ids.size(), 1u);
  EXPECT_FALSE(p3.seqs[0].all_logits);
}

TEST(Scheduler, ChunkedPrefillUnderTheTokenBudget) {
  Sim sim(100, 4, {.max_num_batched_tokens = 8, .max_num_seqs = 4, .max_model_len = 64});
  Request* r = sim.add(20, 2);
  auto p1 = sim.step();
  ASSERT_EQ(p1.seqs.size(), 1u);
  EXPECT_EQ(p1.seqs[0].token_ids.size(), 8u);
  EXPECT_EQ(p1.seqs[0].start_pos, 0);
  EXPECT_FALSE(p1.seqs[0].sample);
  auto p2 = sim.step();
  EXPECT_EQ(p2.seqs[0].start_pos, 8);
  EXPECT_FALSE(p2.seqs[0].sample);
  auto p3 = sim.step();
  EXPECT_EQ(p3.seqs[0].start_pos, 16);
  EXPECT_EQ(p3.seqs[0].token_ids.size(), 4u);
  EXPECT_TRUE(p3.seqs[0].sample);
  EXPECT_EQ(r->num_output_tokens(), 1);
  auto p4 = sim.step();  // decode of the sampled token
  ASSERT_EQ(p4.seqs.size(), 1u);
  EXPECT_EQ(p4.seqs[0].token_ids, std::vector<int32_t>{7});
  EXPECT_EQ(p4.seqs[0].start_pos, 20);
  EXPECT_EQ(r->status, RequestStatus::Finished);
  EXPECT_EQ(sim.kv.num_free_blocks(), 100);
}

TEST(Scheduler, RunningDecodesComeBeforeNewPrefills) {
  Sim sim(100, 4, {.max_num_batched_tokens = 10, .max_num_seqs = 8, .max_model_len = 64});
  Request* a = sim.add(4, 10);
  sim.step();  // a prefilled, sampled its first token
  Request* b = sim.add(30, 2, 500);
  auto p = sim.step();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].request_id, a->id);
  EXPECT_EQ(p.seqs[0].token_ids.size(), 1u);
  EXPECT_EQ(p.seqs[1].request_id, b->id);
  EXPECT_EQ(p.seqs[1].token_ids.size(), 9u);  // the rest of the budget
  EXPECT_EQ(p.num_tokens, 10);
}

TEST(Scheduler, MaxNumSeqsLimitsAdmission) {
  Sim sim(100, 4, {.max_num_batched_tokens = 100, .max_num_seqs = 2, .max_model_len = 64});
  for (int i = 0; i < 4; ++i) sim.add(3, 5);
  auto p = sim.step();
  EXPECT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(sim.sched.num_running(), 2u);
  EXPECT_EQ(sim.sched.num_waiting(), 2u);
  for (int i = 0; i < 5; ++i) sim.step();  // the first two finish at step 5, the others start
  EXPECT_EQ(sim.sched.num_waiting(), 0u);
  EXPECT_EQ(sim.sched.num_running(), 2u);
}

TEST(Scheduler, FirstComeFirstServedWithoutSkipping) {
  // 6 blocks of 4: a holds 4 blocks; the 12-token b does not fit, so c (small) waits behind it.
  Sim sim(6, 4, {.max_num_batched_tokens = 100, .max_num_seqs = 8, .max_model_len = 24});
  Request* a = sim.add(15, 3);
  sim.step();
  Request* b = sim.add(12, 1);
  Request* c = sim.add(2, 1);
  auto p = sim.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].request_id, a->id);
  EXPECT_EQ(b->status, RequestStatus::Waiting);
  EXPECT_EQ(c->status, RequestStatus::Waiting);
  while (a->status != RequestStatus::Finished) {
    EXPECT_EQ(b->status, RequestStatus::Waiting);
    sim.step();
  }
  auto p3 = sim.step();
  ASSERT_EQ(p3.seqs.size(), 2u);
  EXPECT_EQ(p3.seqs[0].request_id, b->id);
  EXPECT_EQ(p3.seqs[1].request_id, c->id);
}

TEST(Scheduler, PreemptsTheNewestAndRecomputesItLater) {
  // 4 blocks of 4 tokens. Two requests of 8 prompt tokens each take 2 blocks; the decode of
  // their first sampled token (position 8) needs a third block each, which only one can get.
  Sim sim(4, 4, {.max_num_batched_tokens = 100, .max_num_seqs = 8, .max_model_len = 16});
  Request* a = sim.add(8, 6, 100);
  Request* b = sim.add(8, 6, 200);
  sim.step();  // both prefill and sample
  EXPECT_EQ(sim.kv.num_free_blocks(), 0);
  auto p = sim.step();  // both need a block for position 8
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], b->id);
  EXPECT_EQ(b->status, RequestStatus::Waiting);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_EQ(b->num_preemptions, 1);
  EXPECT_EQ(sim.sched.num_preemptions(), 1);
  EXPECT_FALSE(sim.kv.has(b->id));
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].request_id, a->id);
  // Run until a finishes; then b is recomputed from scratch: prompt + its one generated token.
  while (a->status != RequestStatus::Finished) sim.step();
  StepPlan resume;
  for (int i = 0; i < 3 && resume.seqs.empty(); ++i) resume = sim.step();
  ASSERT_EQ(resume.seqs.size(), 1u);
  EXPECT_EQ(resume.seqs[0].request_id, b->id);
  EXPECT_EQ(resume.seqs[0].start_pos, 0);
  EXPECT_EQ(resume.seqs[0].token_ids.size(), 9u);
  EXPECT_EQ(resume.seqs[0].token_ids.back(), 7);
  EXPECT_TRUE(resume.seqs[0].sample);
  while (b->status != RequestStatus::Finished) sim.step();
  EXPECT_EQ(b->num_output_tokens(), 6);
  EXPECT_EQ(sim.kv.num_free_blocks(), 4);
}

TEST(Scheduler, AbortFreesBlocksAtOnce) {
  Sim sim(10, 4, {.max_num_batched_tokens = 100, .max_num_seqs = 8, .max_model_len = 40});
  Request* a = sim.add(9, 10);
  Request* b = sim.add(5, 10);
  sim.step();
  EXPECT_EQ(sim.kv.num_free_blocks(), 10 - 3 - 2);
  EXPECT_TRUE(sim.sched.abort(a->id));
  EXPECT_EQ(sim.kv.num_free_blocks(), 8);
  EXPECT_EQ(a->status, RequestStatus::Finished);
  EXPECT_EQ(a->finish, FinishReason::Abort);
  EXPECT_FALSE(sim.sched.abort(a->id));
  Request* c = sim.add(3, 1);
  EXPECT_TRUE(sim.sched.abort(c->id));  // aborting a waiting request works too
  auto p = sim.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].request_id, b->id);
}

TEST(Scheduler, PrefixCacheSkipsComputedBlocks) {
  Sim sim(20, 4, {.max_num_batched_tokens = 100, .max_num_seqs = 8, .max_model_len = 40}, true);
  Request* a = sim.add(10, 1);
  sim.step();
  EXPECT_EQ(a->status, RequestStatus::Finished);
  Request* b = sim.add(10, 1);  // same prompt
  auto p = sim.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].start_pos, 8);
  EXPECT_EQ(p.seqs[0].token_ids.size(), 2u);
  EXPECT_TRUE(p.seqs[0].sample);
  EXPECT_EQ(b->num_output_tokens(), 1);
}

}  // namespace
}  // namespace sieve::engine
