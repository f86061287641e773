// Metrics on synthetic request timelines with hand-computed expectations.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "bench/metrics.h"
#include "bench/report.h"

namespace sieve::bench {
namespace {

RequestRecord rec(double start, std::vector<double> chunks, int prompt, int out,
                  std::string err = "") {
  RequestRecord r;
  r.arrival_time = start;
  r.start_time = start;
  r.chunk_times = std::move(chunks);
  r.prompt_len = prompt;
  r.output_tokens = out;
  r.error = std::move(err);
  return r;
}

// A: 4 chunks of 1 token; B: a single output token; C: failed; D: 3 chunks carrying 9 tokens.
std::vector<RequestRecord> timeline() {
  return {rec(0.0, {0.5, 0.6, 0.8, 1.0}, 10, 4), rec(0.2, {0.5}, 20, 1),
          rec(0.1, {}, 30, -1, "HTTP 500 Internal Server Error: boom"),
          rec(1.0, {1.4, 2.0, 2.5}, 40, 9)};
}

constexpr double kTol = 1e-9;

TEST(BenchStats, NumpyConventions) {
  std::vector<double> v{3, 1, 2, 10};
  EXPECT_DOUBLE_EQ(mean_of(v), 4.0);
  EXPECT_DOUBLE_EQ(median_of(v), 2.5);
  EXPECT_NEAR(std_of(v), std::sqrt((1 + 9 + 4 + 36) / 4.0), kTol);  // population std
  EXPECT_NEAR(percentile_of(v, 99), 3 + 0.97 * 7, kTol);            // rank 2.97 of sorted
  EXPECT_DOUBLE_EQ(percentile_of(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile_of(v, 100), 10.0);
  EXPECT_DOUBLE_EQ(mean_of({}), 0.0);
  EXPECT_DOUBLE_EQ(percentile_of({}, 99), 0.0);
}

TEST(BenchRecord, DerivedTimes) {
  auto t = timeline();
  EXPECT_NEAR(t[0].ttft(), 0.5, kTol);
  EXPECT_NEAR(t[0].latency(), 1.0, kTol);
  auto itl = t[0].itls();
  ASSERT_EQ(itl.size(), 3u);
  EXPECT_NEAR(itl[0], 0.1, kTol);
  EXPECT_NEAR(itl[1], 0.2, kTol);
  EXPECT_NEAR(itl[2], 0.2, kTol);
  EXPECT_TRUE(t[1].itls().empty());
  EXPECT_FALSE(t[2].success());
  EXPECT_EQ(t[2].output_len(), 0);
  EXPECT_EQ(t[2].ttft(), 0.0);
  // Without usage: the fallback count, else 1 as vLLM does without a tokenizer.
  RequestRecord nousage = rec(0, {1, 2}, 5, -1);
  EXPECT_EQ(nousage.output_len(), 1);
  nousage.fallback_output_tokens = 2;
  EXPECT_EQ(nousage.output_len(), 2);
  // A stream without any choice chunk is a failure even without an error text.
  EXPECT_FALSE(rec(0, {}, 5, 3).success());
}

TEST(BenchMetrics, CountsAndThroughputs) {
  Metrics m = compute_metrics(timeline(), 3.0, {99}, {});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 70);   // the failed request's 30 input tokens are not counted
  EXPECT_EQ(m.total_output, 14);  // 4 + 1 + 9: usage, not chunks
  EXPECT_NEAR(m.request_throughput, 1.0, kTol);
  EXPECT_NEAR(m.output_throughput, 14.0 / 3.0, kTol);
  EXPECT_NEAR(m.total_token_throughput, 84.0 / 3.0, kTol);
  EXPECT_EQ(m.output_lens, (std::vector<int>{4, 1, 0, 9}));
  EXPECT_EQ(m.request_goodput, 0.0);
}

TEST(BenchMetrics, Ttft) {
  Metrics m = compute_metrics(timeline(), 3.0, {99}, {});
  EXPECT_NEAR(m.ttft.mean_ms, 400.0, 1e-6);
  EXPECT_NEAR(m.ttft.median_ms, 400.0, 1e-6);
  EXPECT_NEAR(m.ttft.std_ms, 1000.0 * std::sqrt(0.02 / 3.0), 1e-6);
  ASSERT_EQ(m.ttft.percentiles_ms.size(), 1u);
  EXPECT_EQ(m.ttft.percentiles_ms[0].first, 99.0);
  EXPECT_NEAR(m.ttft.percentiles_ms[0].second, 498.0, 1e-6);
}

TEST(BenchMetrics, TpotPerRequestSkipsSingleTokenRequests) {
  Metrics m = compute_metrics(timeline(), 3.0, {50, 99}, {});
  // A: (1.0 - 0.5) / 3; D: (1.5 - 0.4) / 8 tokens (9 tokens in 3 chunks); B has one token.
  double a = 0.5 / 3.0, d = 1.1 / 8.0;
  EXPECT_NEAR(m.tpot.mean_ms, 1000.0 * (a + d) / 2, 1e-6);
  EXPECT_NEAR(m.tpot.median_ms, 1000.0 * (a + d) / 2, 1e-6);
  EXPECT_NEAR(m.tpot.std_ms, 1000.0 * (a - d) / 2, 1e-6);
  EXPECT_NEAR(m.tpot.percentiles_ms[1].second, 1000.0 * (d + 0.99 * (a - d)), 1e-6);
}

TEST(BenchMetrics, ItlPoolsChunkGaps) {
  Metrics m = compute_metrics(timeline(), 3.0, {99}, {});
  // gaps: A 0.1 0.2 0.2, D 0.6 0.5 (one gap per chunk, not per token).
  EXPECT_NEAR(m.itl.mean_ms, 320.0, 1e-6);
  EXPECT_NEAR(m.itl.median_ms, 200.0, 1e-6);
  EXPECT_NEAR(m.itl.percentiles_ms[0].second, 596.0, 1e-6);
}

TEST(BenchMetrics, E2el) {
  Metrics m = compute_metrics(timeline(), 3.0, {99}, {});
  EXPECT_NEAR(m.e2el.mean_ms, 1000.0 * 2.8 / 3.0, 1e-6);
  EXPECT_NEAR(m.e2el.median_ms, 1000.0, 1e-6);
  EXPECT_NEAR(m.e2el.percentiles_ms[0].second, 1000.0 * (1.0 + 0.98 * 0.5), 1e-6);
}

TEST(BenchMetrics, PeakOutputPerSecondAndConcurrency) {
  Metrics m = compute_metrics(timeline(), 3.0, {99}, {});
  // Second 0 holds chunks 0.5 0.6 0.8 (A) and 0.5 (B); second 1: 1.0 (A), 1.4 (D); 2: 2.0 2.5.
  EXPECT_EQ(m.max_output_tokens_per_s, 4.0);
  // [0,1.0) [0.2,0.5) [1.0,2.5): A ends exactly when D starts, so the peak is 2 (A and B).
  EXPECT_EQ(m.max_concurrent_requests, 2);
}

TEST(BenchMetrics, Goodput) {
  auto t = timeline();
  EXPECT_NEAR(compute_metrics(t, 3.0, {99}, parse_goodput("ttft:450")).request_goodput, 2.0 / 3.0,
              kTol);
  // B's TPOT counts as 0 for goodput; D's 137.5 ms fits 150.
  EXPECT_NEAR(compute_metrics(t, 3.0, {99}, parse_goodput("ttft:450 tpot:150")).request_goodput,
              2.0 / 3.0, kTol);
  EXPECT_NEAR(compute_metrics(t, 3.0, {99}, parse_goodput("ttft:450,e2el:1000")).request_goodput,
              1.0 / 3.0, kTol);
  EXPECT_THROW(parse_goodput("itl:5"), std::exception);
  EXPECT_THROW(parse_goodput("ttft"), std::exception);
  EXPECT_THROW(parse_goodput("ttft:-1"), std::exception);
}

TEST(BenchMetrics, AllFailed) {
  std::vector<RequestRecord> t{rec(0, {}, 5, -1, "x"), rec(0, {}, 5, -1, "y")};
  Metrics m = compute_metrics(t, 1.0, {99}, {});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.total_input, 0);
  EXPECT_EQ(m.ttft.mean_ms, 0.0);
  EXPECT_EQ(m.max_output_tokens_per_s, 0.0);
  EXPECT_EQ(m.max_concurrent_requests, 0);
}

TEST(BenchReport, BlockMatchesVllmLayout) {
  Metrics m = compute_metrics(timeline(), 3.0, {99}, parse_goodput("ttft:450"));
  ReportOptions o;
  o.duration_s = 3.0;
  o.max_concurrency = 8;
  o.request_rate = 2.5;
  o.goodput = true;
  o.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  std::string want =
      "============ Serving Benchmark Result ============\n"
      "Successful requests:                     3         \n"
      "Failed requests:                         1         \n"
      "Maximum request concurrency:             8         \n"
      "Request rate configured (RPS):           2.50      \n"
      "Benchmark duration (s):                  3.00      \n"
      "Total input tokens:                      70        \n"
      "Total generated tokens:                  14        \n"
      "Request throughput (req/s):              1.00      \n"
      "Request goodput (req/s):                 0.67      \n"
      "Output token throughput (tok/s):         4.67      \n"
      "Peak output token throughput (tok/s):    4.00      \n"
      "Peak concurrent requests:                2.00      \n"
      "Total token throughput (tok/s):          28.00     \n"
      "---------------Time to First Token----------------\n"
      "Mean TTFT (ms):                          400.00    \n"
      "Median TTFT (ms):                        400.00    \n"
      "P99 TTFT (ms):                           498.00    \n"
      "-----Time per Output Token (excl. 1st token)------\n"
      "Mean TPOT (ms):                          152.08    \n"
      "Median TPOT (ms):                        152.08    \n"
      "P99 TPOT (ms):                           166.38    \n"
      "---------------Inter-token Latency----------------\n"
      "Mean ITL (ms):                           320.00    \n"
      "Median ITL (ms):                         200.00    \n"
      "P99 ITL (ms):                            596.00    \n"
      "----------------End-to-end Latency----------------\n"
      "Mean E2EL (ms):                          933.33    \n"
      "Median E2EL (ms):                        1000.00   \n"
      "P99 E2EL (ms):                           1490.00   \n"
      "==================================================\n";
  EXPECT_EQ(format_report(m, o), want);
}

TEST(BenchMetrics, ClientQueueTimes) {
  auto t = timeline();
  t[0].arrival_time = -0.3;  // waited 0.3 s for a concurrency slot
  t[3].arrival_time = 0.9;   // 0.1 s
  Metrics m = compute_metrics(t, 3.0, {99}, {});
  EXPECT_NEAR(m.client_queue_time.mean_ms, 1000.0 * 0.4 / 3.0, 1e-6);
  EXPECT_NEAR(m.e2el_including_client_queue.mean_ms, 1000.0 * (1.3 + 0.3 + 1.6) / 3.0, 1e-6);
  ReportOptions o;
  o.duration_s = 3.0;
  o.percentile_metrics = {"client_queue_time", "e2el_including_client_queue"};
  o.request_rate = INFINITY;
  EXPECT_EQ(format_report(m, o).find("Queue"), std::string::npos);  // no limit: nothing queues
  o.max_concurrency = 2;
  std::string s = format_report(m, o);
  EXPECT_NE(s.find("---------------Client-side Queueing---------------\n"
                   "Mean Client Queue Time (ms):             133.33    \n"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("Queue-inclusive"), std::string::npos);  // only with a finite request rate
  o.request_rate = 4;
  s = format_report(m, o);
  EXPECT_NE(s.find("--------Queue-inclusive End-to-end Latency--------\n"), std::string::npos) << s;
  EXPECT_NE(s.find("Median E2EL incl. Client Queue (ms):     1300.00   \n"), std::string::npos)
      << s;
  auto j = benchmark_json(m, t, o);
  EXPECT_NEAR(j["p99_client_queue_time_ms"].get<double>(), 100.0 + 0.98 * 200.0,
              1e-6);  // of 0, 0.1, 0.3 s
  EXPECT_TRUE(j.contains("mean_e2el_including_client_queue_ms"));
}

TEST(BenchReport, DefaultsOmitOptionalLines) {
  Metrics m = compute_metrics(timeline(), 3.0, {90, 99.9}, {});
  ReportOptions o;
  o.duration_s = 3.0;
  o.request_rate = INFINITY;
  o.percentiles = {90, 99.9};
  std::string s = format_report(m, o);
  EXPECT_EQ(s.find("Maximum request concurrency"), std::string::npos);
  EXPECT_EQ(s.find("Request rate configured"), std::string::npos);
  EXPECT_EQ(s.find("goodput"), std::string::npos);
  EXPECT_EQ(s.find("E2EL"), std::string::npos);  // e2el is printed only when asked for
  EXPECT_NE(s.find("P99.9 ITL (ms):"), std::string::npos);
  EXPECT_NE(s.find("P90 TPOT (ms):"), std::string::npos);
}

TEST(BenchReport, JsonFieldsAndOrder) {
  auto t = timeline();
  Metrics m = compute_metrics(t, 3.0, {99}, {});
  ReportOptions o;
  o.duration_s = 3.0;
  o.request_rate = INFINITY;
  auto j = benchmark_json(m, t, o);
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  std::vector<std::string> want{"duration",
                                "completed",
                                "failed",
                                "total_input_tokens",
                                "total_output_tokens",
                                "request_throughput",
                                "request_goodput",
                                "output_throughput",
                                "total_token_throughput",
                                "input_lens",
                                "output_lens",
                                "ttfts",
                                "itls",
                                "latencies",
                                "start_times",
                                "queue_times",
                                "generated_texts",
                                "errors",
                                "max_output_tokens_per_s",
                                "max_concurrent_requests",
                                "rtfx",
                                "mean_ttft_ms",
                                "median_ttft_ms",
                                "std_ttft_ms",
                                "p99_ttft_ms",
                                "mean_tpot_ms",
                                "median_tpot_ms",
                                "std_tpot_ms",
                                "p99_tpot_ms",
                                "mean_itl_ms",
                                "median_itl_ms",
                                "std_itl_ms",
                                "p99_itl_ms"};
  EXPECT_EQ(keys, want);
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_EQ(j["input_lens"], nlohmann::json({10, 20, 30, 40}));
  EXPECT_EQ(j["output_lens"], nlohmann::json({4, 1, 0, 9}));
  EXPECT_EQ(j["errors"][2], "HTTP 500 Internal Server Error: boom");
  EXPECT_EQ(j["ttfts"][2], 0.0);
  EXPECT_EQ(j["itls"][1].size(), 0u);
  EXPECT_EQ(j["itls"][3].size(), 2u);
  EXPECT_NEAR(j["latencies"][3].get<double>(), 1.5, kTol);
  EXPECT_EQ(j["max_concurrent_requests"], 2);
}

TEST(BenchReport, FileNameAndPythonFloats) {
  EXPECT_EQ(python_float(INFINITY), "inf");
  EXPECT_EQ(python_float(4), "4.0");
  EXPECT_EQ(python_float(0.5), "0.5");
  EXPECT_EQ(percentile_word(99), "99");
  EXPECT_EQ(percentile_word(99.9), "99.9");
  EXPECT_EQ(default_result_filename("openai", INFINITY, 32, "org/MiniMax-M3", "20261202-101500"),
            "openai-infqps-concurrency32-MiniMax-M3-20261202-101500.json");
  EXPECT_EQ(default_result_filename("sieve", 2, std::nullopt, "tiny", "d"),
            "sieve-2.0qps-tiny-d.json");
  EXPECT_EQ(centered(" Serving Benchmark Result ", '='),
            "============ Serving Benchmark Result ============");
  EXPECT_EQ(centered("Time per Output Token (excl. 1st token)", '-'),
            "-----Time per Output Token (excl. 1st token)------");
}

}  // namespace
}  // namespace sieve::bench
