// `sieve bench serve` end to end against the in-test fake server over loopback.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "bench/serve.h"
#include "fake_openai_server.h"

namespace sieve::bench {
namespace {

using testing::FakeOpenAIServer;
using testing::Fault;

// The line of the result block starting with `label` (notes printed before the block are skipped).
std::string line_of(const std::string& text, const std::string& label) {
  auto at = text.find("Serving Benchmark Result");
  std::istringstream in(at == std::string::npos ? std::string() : text.substr(at));
  std::string l;
  while (std::getline(in, l))
    if (l.rfind(label, 0) == 0) return l;
  return "";
}

std::string int_line(const std::string& label, long long v) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%-40s %-10lld", label.c_str(), v);
  return buf;
}

ServeOptions base_options(const FakeOpenAIServer& s) {
  ServeOptions o;
  o.base_url = s.base_url();
  o.random_input_len = 32;
  o.random_output_len = 16;
  o.num_prompts = 12;
  o.max_concurrency = 4;
  o.client.read_timeout_s = 1.0;  // the stalled request of the fault test waits 2.5 s
  return o;
}

TEST(BenchServe, TokenIdPromptsGiveExactCounts) {
  FakeOpenAIServer s;
  ServeOptions o = base_options(s);
  o.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  o.save_result = true;
  o.save_detailed = true;
  o.result_dir = ::testing::TempDir() + "/bench_serve_results";
  std::filesystem::remove_all(o.result_dir);
  std::ostringstream out;
  ServeOutcome r = run_serve(o, nullptr, out);
  std::string text = out.str();

  // The model came from /v1/models; the block has vLLM's lines.
  EXPECT_NE(text.find("First model name: fake-model"), std::string::npos);
  EXPECT_NE(text.find("============ Serving Benchmark Result ============\n"), std::string::npos);
  EXPECT_EQ(line_of(text, "Successful requests:"), int_line("Successful requests:", 12));
  EXPECT_EQ(line_of(text, "Failed requests:"), int_line("Failed requests:", 0));
  EXPECT_EQ(line_of(text, "Maximum request concurrency:"),
            int_line("Maximum request concurrency:", 4));
  EXPECT_EQ(line_of(text, "Total input tokens:"), int_line("Total input tokens:", 12 * 32));
  EXPECT_EQ(line_of(text, "Total generated tokens:"), int_line("Total generated tokens:", 12 * 16));
  EXPECT_EQ(line_of(text, "Request rate configured"), "");  // inf is not printed
  for (const char* l : {"Benchmark duration (s):", "Request throughput (req/s):",
                        "Output token throughput (tok/s):", "Peak output token throughput (tok/s):",
                        "Peak concurrent requests:", "Total token throughput (tok/s):",
                        "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):", "Mean TPOT (ms):",
                        "P99 ITL (ms):", "Mean E2EL (ms):"})
    EXPECT_TRUE(std::regex_match(
        line_of(text, l),
        std::regex(std::regex_replace(std::string(l), std::regex(R"([()/])"), R"(\$&)") +
                   " +[0-9]+\\.[0-9]{2} *")))
        << l << " -> \"" << line_of(text, l) << "\"";
  EXPECT_NE(text.find("\n==================================================\n"), std::string::npos);

  // What the server got.
  auto bodies = s.bodies();
  ASSERT_EQ(bodies.size(), 12u);
  for (const auto& b : bodies) {
    EXPECT_EQ(b["model"], "fake-model");
    ASSERT_TRUE(b["prompt"].is_array());
    EXPECT_EQ(b["prompt"].size(), 32u);
    EXPECT_EQ(b["max_tokens"], 16);
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    EXPECT_EQ(b["ignore_eos"], true);
  }

  // The JSON on disk.
  ASSERT_FALSE(r.saved_path.empty());
  EXPECT_TRUE(
      std::regex_match(std::filesystem::path(r.saved_path).filename().string(),
                       std::regex(R"(openai-infqps-concurrency4-fake-model-\d{8}-\d{6}\.json)")));
  std::ifstream f(r.saved_path);
  auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_input_tokens"], 12 * 32);
  EXPECT_EQ(j["total_output_tokens"], 12 * 16);
  EXPECT_EQ(j["num_prompts"], 12);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_EQ(j["model_id"], "fake-model");
  EXPECT_EQ(j["backend"], "openai");
  EXPECT_LE(j["max_concurrent_requests"].get<int>(), 4);
  EXPECT_GE(j["max_concurrent_requests"].get<int>(), 1);
  ASSERT_EQ(j["itls"].size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(j["input_lens"][i], 32);
    EXPECT_EQ(j["output_lens"][i], 16);
    EXPECT_EQ(j["itls"][i].size(), 15u);  // 16 chunks of one token
    EXPECT_EQ(j["errors"][i], "");
    EXPECT_GT(j["ttfts"][i].get<double>(), 0.0);
    EXPECT_GE(j["latencies"][i].get<double>(), j["ttfts"][i].get<double>());
  }
  for (const char* k : {"duration", "request_throughput", "output_throughput",
                        "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
                        "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms",
                        "max_output_tokens_per_s", "queue_times", "latencies", "date"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_NEAR(j["output_throughput"].get<double>(), 12 * 16 / j["duration"].get<double>(), 1e-6);
  EXPECT_NEAR(j["request_throughput"].get<double>(), 12 / j["duration"].get<double>(), 1e-9);
}

TEST(BenchServe, ChunksCarryingSeveralTokensAndNoDetail) {
  FakeOpenAIServer s;
  s.tokens_per_chunk = 4;
  ServeOptions o = base_options(s);
  o.model = "fake-model";
  o.save_result = true;
  o.result_dir = ::testing::TempDir();
  o.result_filename = "bench_serve_multi.json";
  std::ostringstream out;
  ServeOutcome r = run_serve(o, nullptr, out);
  EXPECT_EQ(r.result["total_output_tokens"], 12 * 16);  // from usage, not from 4 chunks each
  EXPECT_FALSE(r.result.contains("itls"));              // per-request arrays need --save-detailed
  EXPECT_FALSE(r.result.contains("input_lens"));
  EXPECT_TRUE(r.result.contains("latencies"));
  EXPECT_EQ(std::filesystem::path(r.saved_path).filename(), "bench_serve_multi.json");
  // TPOT = (E2EL - TTFT) / 15 per request while ITL pools the 3 gaps between 4 chunks of every
  // request: mean ITL = sum(E2EL - TTFT) / 36 and mean TPOT = sum(E2EL - TTFT) / 180, so 5x.
  double tpot = r.result["mean_tpot_ms"], itl = r.result["mean_itl_ms"];
  EXPECT_NEAR(itl, 5.0 * tpot, 1e-9 * std::max(1.0, itl));
  EXPECT_GT(itl, 0.0);
}

TEST(BenchServe, FailuresAreCountedAndTheRunCompletes) {
  FakeOpenAIServer s;
  s.stall_s = 2.5;
  s.faults = {
      {2, Fault::http_500}, {5, Fault::disconnect}, {8, Fault::stall}, {11, Fault::error_event}};
  ServeOptions o = base_options(s);
  o.model = "fake-model";
  o.num_prompts = 20;
  o.save_detailed = true;
  std::ostringstream out;
  auto t0 = std::chrono::steady_clock::now();
  ServeOutcome r = run_serve(o, nullptr, out);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 20.0);
  EXPECT_EQ(r.result["completed"], 16);
  EXPECT_EQ(r.result["failed"], 4);
  EXPECT_EQ(r.result["total_input_tokens"], 16 * 32);
  EXPECT_EQ(r.result["total_output_tokens"], 16 * 16);
  std::string errors;
  int nonempty = 0;
  for (const auto& e : r.result["errors"]) {
    errors += e.get<std::string>() + "\n";
    nonempty += !e.get<std::string>().empty();
  }
  EXPECT_EQ(nonempty, 4);
  EXPECT_NE(errors.find("HTTP 500"), std::string::npos) << errors;
  EXPECT_NE(errors.find("injected failure"), std::string::npos) << errors;
  EXPECT_NE(errors.find("connection lost"), std::string::npos) << errors;
  EXPECT_NE(errors.find("timed out"), std::string::npos) << errors;
  EXPECT_NE(errors.find("server error in stream: injected stream error"), std::string::npos)
      << errors;
  std::string text = out.str();
  EXPECT_NE(text.find("Failed requests during benchmark run detected (capping to 10):"),
            std::string::npos);
  EXPECT_EQ(line_of(text, "Failed requests:"), int_line("Failed requests:", 4));
}

TEST(BenchServe, MissingUsageFallsBackToChunks) {
  FakeOpenAIServer s;
  s.faults = {{0, Fault::no_usage}};
  ServeOptions o = base_options(s);
  o.model = "fake-model";
  o.num_prompts = 1;
  s.tokens_per_chunk = 4;
  std::ostringstream out;
  ServeOutcome r = run_serve(o, nullptr, out);
  EXPECT_EQ(r.result["completed"], 1);
  EXPECT_EQ(r.result["total_output_tokens"], 4);  // 4 chunks, no tokenizer to re-count text
}

TEST(BenchServe, UnreachableServer) {
  int port;
  {
    FakeOpenAIServer s;
    port = s.port();
  }
  ServeOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(port);
  o.num_prompts = 3;
  o.random_input_len = 4;
  o.random_output_len = 4;
  EXPECT_THROW(run_serve(o, nullptr, std::cout), std::exception);  // no /v1/models to ask
  o.model = "m";
  o.client.connect_timeout_s = 1;
  std::ostringstream out;
  ServeOutcome r = run_serve(o, nullptr, out);
  EXPECT_EQ(r.result["failed"], 3);
  EXPECT_EQ(r.result["completed"], 0);
}

TEST(BenchServe, ChatEndpointWithTextPrompts) {
  FakeOpenAIServer s;
  ServeOptions o = base_options(s);
  o.model = "fake-model";
  o.endpoint = "/v1/chat/completions";
  o.dataset_name = "gsm8k";
  o.output_len = 8;
  o.num_prompts = 5;
  o.save_detailed = true;
  o.temperature = 0.0;
  std::ostringstream out;
  ServeOutcome r = run_serve(o, nullptr, out);
  EXPECT_EQ(r.result["completed"], 5);
  EXPECT_EQ(r.result["backend"], "openai-chat");
  long long want_in = 0;
  for (const auto& b : s.bodies()) {
    std::string content = b["messages"][0]["content"];
    EXPECT_EQ(content.rfind("Question: ", 0), 0u);
    EXPECT_EQ(b["max_completion_tokens"], 8);
    EXPECT_EQ(b["temperature"], 0.0);
    EXPECT_FALSE(b.contains("ignore_eos"));
    want_in += (long long)content.size();  // the fake server's prompt_tokens
  }
  EXPECT_EQ(r.result["total_input_tokens"], want_in);  // input counts from usage
  EXPECT_EQ(r.result["total_output_tokens"], 40);
  for (const auto& t : r.result["generated_texts"]) EXPECT_EQ(t, " t0 t1 t2 t3 t4 t5 t6 t7");
}

TEST(BenchServe, InterruptKeepsResultsSoFar) {
  FakeOpenAIServer s;
  ServeOptions o = base_options(s);
  o.model = "fake-model";
  o.num_prompts = 200;
  o.request_rate = 20;  // ~10 s in all
  std::atomic<bool> stop{false};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    stop = true;
  });
  std::ostringstream out;
  auto t0 = std::chrono::steady_clock::now();
  ServeOutcome r = run_serve(o, &stop, out);
  t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.interrupted);
  EXPECT_LT(secs, 3.0);
  int done = r.result["completed"];
  EXPECT_GT(done, 0);
  EXPECT_LT(done, 200);
  EXPECT_EQ(r.result["failed"], 0);  // streams cut by the interrupt are left out, not failed
  EXPECT_NE(out.str().find("Interrupted"), std::string::npos);
  EXPECT_NE(out.str().find("Request rate configured (RPS):           20.00"), std::string::npos);
}

TEST(BenchServe, BadOptions) {
  ServeOptions o;
  o.model = "m";
  o.dataset_name = "sharegpt";
  EXPECT_THROW(run_serve(o, nullptr, std::cout), std::exception);
  o.dataset_name = "random";
  o.endpoint = "/v1/embeddings";
  EXPECT_THROW(run_serve(o, nullptr, std::cout), std::exception);
  o.endpoint = "/v1/chat/completions";  // random token ids cannot be chat messages
  EXPECT_THROW(run_serve(o, nullptr, std::cout), std::exception);
  EXPECT_THROW(parse_metric_list("ttft,foo"), std::exception);
  EXPECT_EQ(parse_percentile_list("50,90,99.9"), (std::vector<double>{50, 90, 99.9}));
}

}  // namespace
}  // namespace sieve::bench
