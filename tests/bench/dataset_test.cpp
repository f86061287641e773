// Prompt sampling: length rules of vLLM and ATOM, token-id prompts, arrival schedules, payloads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "bench/dataset.h"
#include "bench/runner.h"

namespace sieve::bench {
namespace {

TEST(BenchDataset, LengthRanges) {
  auto in = input_length_range(8192, 0.8, RangeMode::atom);
  EXPECT_EQ(in.lo, 6553);
  EXPECT_EQ(in.hi, 8192);
  in = input_length_range(8192, 0.8, RangeMode::vllm);
  EXPECT_EQ(in.lo, 1638);
  EXPECT_EQ(in.hi, 14746);
  in = input_length_range(100, 0.0, RangeMode::vllm);
  EXPECT_EQ(in.lo, 100);
  EXPECT_EQ(in.hi, 100);
  auto out = output_length_range(1, 0.5, RangeMode::vllm);
  EXPECT_EQ(out.lo, 1);  // max(1, floor(0.5))
  EXPECT_EQ(out.hi, 2);
  out = output_length_range(1024, 1.0, RangeMode::atom);
  EXPECT_EQ(out.lo, 1024);
  EXPECT_EQ(out.hi, 1024);
  EXPECT_THROW(input_length_range(10, 1.0, RangeMode::vllm), std::exception);
  EXPECT_THROW(input_length_range(10, -0.1, RangeMode::atom), std::exception);
  EXPECT_THROW(parse_range_mode("sglang"), std::exception);
}

TEST(BenchDataset, RandomTokenIdPrompts) {
  RandomConfig c;
  c.input_len = 50;
  c.output_len = 20;
  c.prefix_len = 7;
  c.range_ratio = 0.5;
  c.vocab_size = 97;
  c.num_prompts = 200;
  c.seed = 3;
  auto reqs = random_dataset(c, nullptr);
  ASSERT_EQ(reqs.size(), 200u);
  std::set<int> lens;
  for (const auto& r : reqs) {
    ASSERT_TRUE(r.use_ids);
    EXPECT_EQ(int(r.token_ids.size()), r.prompt_len);
    EXPECT_GE(r.prompt_len, 7 + 25);
    EXPECT_LE(r.prompt_len, 7 + 75);
    EXPECT_GE(r.output_len, 10);
    EXPECT_LE(r.output_len, 30);
    for (int t : r.token_ids) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, 97);
    }
    EXPECT_TRUE(
        std::equal(reqs[0].token_ids.begin(), reqs[0].token_ids.begin() + 7, r.token_ids.begin()));
    lens.insert(r.prompt_len);
  }
  EXPECT_GT(lens.size(), 20u);  // lengths do vary
  auto again = random_dataset(c, nullptr);
  EXPECT_EQ(again[5].token_ids, reqs[5].token_ids);  // the seed fixes the prompts
  c.range_ratio = 0;
  for (const auto& r : random_dataset(c, nullptr)) {
    EXPECT_EQ(r.prompt_len, 57);
    EXPECT_EQ(r.output_len, 20);
  }
}

// Decoding then encoding does not give the same ids back: id 0 decodes to two characters.
class GrowingCodec : public TextCodec {
 public:
  std::vector<int> encode(const std::string& text) const override {
    std::vector<int> ids;
    for (char c : text) ids.push_back(c == 'X' ? 0 : c - 'a' + 1);
    return ids;
  }
  std::string decode(const std::vector<int>& ids) const override {
    std::string s;
    for (int id : ids) s += id == 0 ? std::string("XX") : std::string(1, char('a' + (id - 1) % 26));
    return s;
  }
  int vocab_size() const override { return 27; }
};

TEST(BenchDataset, RandomTextPromptsWithATokenizer) {
  GrowingCodec tok;
  RandomConfig c;
  c.input_len = 40;
  c.output_len = 4;
  c.num_prompts = 50;
  for (const auto& r : random_dataset(c, &tok)) {
    EXPECT_FALSE(r.use_ids);
    EXPECT_EQ(r.prompt_len, int(tok.encode(r.text).size()));  // the length the server will see
    EXPECT_LE(r.prompt_len, 40);
    EXPECT_GE(r.prompt_len, 30);
  }
}

TEST(BenchDataset, Gsm8kAndJsonl) {
  std::string path = ::testing::TempDir() + "/bench_ds.jsonl";
  {
    std::ofstream f(path);
    f << R"({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"})"
      << "\n";
    f << R"({"question": "Q2", "answer": "#### 5"})"
      << "\n";
  }
  auto g = gsm8k_dataset(path, 3, 64, 1, nullptr);
  ASSERT_EQ(g.size(), 3u);
  std::set<std::string> texts;
  for (auto& r : g) {
    EXPECT_FALSE(r.use_ids);
    EXPECT_EQ(r.output_len, 64);
    EXPECT_EQ(r.prompt_len, 0);  // unknown without a tokenizer: taken from usage later
    texts.insert(r.text);
  }
  EXPECT_EQ(texts,
            (std::set<std::string>{"Question: What is 2+2?\nAnswer:", "Question: Q2\nAnswer:"}));
  {
    std::ofstream f(path);
    f << R"({"prompt": [1, 2, 3], "output_len": 9})"
      << "\n"
      << R"({"prompt": "hi"})"
      << "\n";
  }
  auto j = jsonl_dataset(path, 2, 16, 0, nullptr);
  ASSERT_EQ(j.size(), 2u);
  for (auto& r : j) {
    if (r.use_ids) {
      EXPECT_EQ(r.token_ids, (std::vector<int>{1, 2, 3}));
      EXPECT_EQ(r.prompt_len, 3);
      EXPECT_EQ(r.output_len, 9);
    } else {
      EXPECT_EQ(r.text, "hi");
      EXPECT_EQ(r.output_len, 16);
    }
  }
  std::remove(path.c_str());
  EXPECT_THROW(gsm8k_dataset(path, 1, 1, 0, nullptr), std::exception);
}

TEST(BenchSchedule, ReleaseTimes) {
  auto t = release_times(5, INFINITY, 1.0, 0);
  EXPECT_EQ(t, std::vector<double>(5, 0.0));
  t = release_times(100, 10.0, 1.0, 42);
  ASSERT_EQ(t.size(), 100u);
  EXPECT_NEAR(t.back(), 10.0, 1e-9);  // scaled to n / rate
  for (size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i], t[i - 1]);
  t = release_times(4, 2.0, INFINITY, 0);
  EXPECT_NEAR(t[0], 0.5, 1e-12);
  EXPECT_NEAR(t[3], 2.0, 1e-12);
  EXPECT_THROW(release_times(3, 0.0, 1.0, 0), std::exception);
}

TEST(BenchPayload, CompletionsAndChat) {
  BenchConfig c;
  c.model = "m";
  c.ignore_eos = true;
  SampleRequest r;
  r.use_ids = true;
  r.token_ids = {5, 6};
  r.output_len = 3;
  auto p = make_payload(r, c);
  EXPECT_EQ(p["prompt"], nlohmann::json({5, 6}));
  EXPECT_EQ(p["max_tokens"], 3);
  EXPECT_EQ(p["stream"], true);
  EXPECT_EQ(p["stream_options"]["include_usage"], true);
  EXPECT_EQ(p["ignore_eos"], true);
  EXPECT_FALSE(p.contains("temperature"));
  c.endpoint = "/v1/chat/completions";
  EXPECT_THROW(make_payload(r, c), std::exception);  // chat needs text
  r.use_ids = false;
  r.text = "hello";
  c.temperature = 0.0;
  p = make_payload(r, c);
  EXPECT_EQ(p["messages"][0]["content"], "hello");
  EXPECT_EQ(p["max_completion_tokens"], 3);
  EXPECT_EQ(p["temperature"], 0.0);
}

}  // namespace
}  // namespace sieve::bench
