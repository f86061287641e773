#include <gtest/gtest.h>

#include "server/server.h"

namespace sieve::server {

TEST(Prometheus, ExposesGaugesCountersAndCumulativeHistograms) {
  engine::EngineStats s;
  s.num_running = 3;
  s.num_waiting = 2;
  s.num_blocks = 10;
  s.num_free_blocks = 4;
  s.kv_usage = 0.6;
  s.prompt_tokens = 100;
  s.generation_tokens = 42;
  s.preemptions = 5;
  s.prefix_query_tokens = 400;
  s.prefix_hit_tokens = 100;
  s.ttft = engine::Histogram({0.1, 1.0});
  s.ttft.observe(0.05);
  s.ttft.observe(0.5);
  s.ttft.observe(5.0);
  s.spec_num_drafts = 7;
  s.spec_num_draft_tokens = 21;
  s.spec_num_accepted_tokens = 12;
  s.spec_accepted_per_pos = {6, 4, 2};
  const std::string t = prometheus_text(s, "m\"x");
  auto has = [&](const std::string& line) { return t.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has("sieve:num_requests_running{model_name=\"m\\\"x\"} 3"));
  EXPECT_TRUE(has("sieve:num_requests_waiting{model_name=\"m\\\"x\"} 2"));
  EXPECT_TRUE(has("sieve:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.6"));
  EXPECT_TRUE(has("sieve:kv_cache_blocks_free{model_name=\"m\\\"x\"} 4"));
  EXPECT_TRUE(has("sieve:generation_tokens_total{model_name=\"m\\\"x\"} 42"));
  EXPECT_TRUE(has("sieve:num_preemptions_total{model_name=\"m\\\"x\"} 5"));
  EXPECT_TRUE(has("sieve:prefix_cache_queries_total{model_name=\"m\\\"x\"} 400"));
  EXPECT_TRUE(has("sieve:prefix_cache_hits_total{model_name=\"m\\\"x\"} 100"));
  EXPECT_TRUE(has("sieve:prefix_cache_hit_rate{model_name=\"m\\\"x\"} 0.25"));
  EXPECT_TRUE(has("# TYPE sieve:time_to_first_token_seconds histogram"));
  EXPECT_TRUE(has("sieve:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.1\"} 1"));
  EXPECT_TRUE(has("sieve:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"1\"} 2"));
  EXPECT_TRUE(has("sieve:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"+Inf\"} 3"));
  EXPECT_TRUE(has("sieve:time_to_first_token_seconds_count{model_name=\"m\\\"x\"} 3"));
  EXPECT_TRUE(has("sieve:time_to_first_token_seconds_sum{model_name=\"m\\\"x\"} 5.55"));
  EXPECT_TRUE(has("# TYPE vllm:spec_decode_num_drafts counter"));
  EXPECT_TRUE(has("vllm:spec_decode_num_drafts_total{model_name=\"m\\\"x\"} 7"));
  EXPECT_TRUE(has("vllm:spec_decode_num_draft_tokens_total{model_name=\"m\\\"x\"} 21"));
  EXPECT_TRUE(has("vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\\\"x\"} 12"));
  EXPECT_TRUE(has("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\\\"x\",position=\"2\"} 2"));
}

}  // namespace sieve::server
