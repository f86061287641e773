// The engine against transformers' own MiniMax-M3 code: the bundled model's log-probs and greedy
// continuations, computed by transformers 5.17 in fp32 on the GPU machine
// (tests/reference/train_tiny_m3.py wrote tests/data/golden/). The prompts are 1500 tokens, so
// every sparse layer drops blocks (4 of up to 12 selected).
#include <gtest/gtest.h>

#include "golden_util.h"
#include "model/locate.h"

namespace sieve {
namespace {

using namespace sieve::golden;

TEST(Golden, MobyDickFp32Cache) { check_golden("moby_dick.json", DType::F32, 2e-3); }
TEST(Golden, MobyDickBf16Cache) { check_golden("moby_dick.json", DType::BF16, 2e-2, false, 0.95, 1.5); }
TEST(Golden, MobyDickDenseFp32Cache) { check_golden("moby_dick.dense.json", DType::F32, 2e-3, true); }
TEST(Golden, Sotu1917Fp32Cache) { check_golden("sotu_1917.json", DType::F32, 2e-3); }
TEST(Golden, Sotu1917Bf16Cache) { check_golden("sotu_1917.json", DType::BF16, 2e-2, false, 0.95, 1.5); }
TEST(Golden, SotuModernFp32Cache) { check_golden("sotu_modern.json", DType::F32, 2e-3); }
TEST(Golden, SotuModernBf16Cache) { check_golden("sotu_modern.json", DType::BF16, 2e-2, false, 0.95, 1.5); }
TEST(Golden, ChatFp32Cache) { check_golden("chat.json", DType::F32, 2e-3); }

// Step buffers reserved ahead (as the server does on a GPU) and grown on demand give the same
// logits bit for bit.
TEST(Golden, ReservedStepBuffersChangeNothing) {
  nlohmann::json g = read_json(kGoldenDir + "/chat.json");
  std::vector<int32_t> prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  auto a = model::Model::load(model_dir());
  auto b = model::Model::load(model_dir());
  b->reserve_step(4096, 16);
  EngineRun ra = run_engine(*a, prompt, 8, DType::BF16, false, 384);
  EngineRun rb = run_engine(*b, prompt, 8, DType::BF16, false, 384);
  EXPECT_EQ(ra.logprobs, rb.logprobs);
  EXPECT_EQ(ra.greedy, rb.greedy);
}

// A warm-up step (as the server runs on a GPU before sizing the cache) leaves nothing behind that
// changes a later run.
TEST(Golden, WarmUpChangesNothing) {
  nlohmann::json g = read_json(kGoldenDir + "/chat.json");
  std::vector<int32_t> prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  auto a = model::Model::load(model_dir());
  auto b = model::Model::load(model_dir());
  {
    engine::Runner runner(*b);
    engine::warm_up(runner, DType::FP8_E4M3, DType::BF16, 700);
  }
  EngineRun ra = run_engine(*a, prompt, 8, DType::BF16, false, 384);
  EngineRun rb = run_engine(*b, prompt, 8, DType::BF16, false, 384);
  EXPECT_EQ(ra.logprobs, rb.logprobs);
  EXPECT_EQ(ra.greedy, rb.greedy);
}

TEST(Golden, BundledModelIsFound) {
  EXPECT_EQ(fs::path(model::bundled_model_dir(SIEVE_SOURCE_DIR)).filename(), "minimax-m3-tiny");
}

}  // namespace
}  // namespace sieve
