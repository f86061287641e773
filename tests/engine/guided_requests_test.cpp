// Guided decoding through the engine: whole requests (fake model) that must come out as JSON
// objects or as one of the choices.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "fake_model.h"
#include "guided/guided.h"

namespace sieve::engine {
namespace {

using namespace std::chrono_literals;

bool accepts_prefix(const std::string& s) {
  guided::JsonPrefix p;
  return p.push(s);
}
bool accepts_complete(const std::string& s) {
  guided::JsonPrefix p;
  return p.push(s) && p.complete();
}

// Through the engine: byte tokens 0..255 (the fake model's pseudo-random logits pick among
// what the mask allows), end of sequence 256.
TEST(Guided, RequestsComeOutAsJsonObjectsOrAChoice) {
  auto vocab = std::make_shared<guided::TokenBytes>(257);
  for (int b = 0; b < 256; ++b) (*vocab)[size_t(b)] = std::string(1, char(b));
  testing::FakeModel model(257, 16);
  model.allocate_caches({.num_blocks = 64});
  Engine engine(
      model,
      testing::engine_config({.max_num_batched_tokens = 256, .max_num_seqs = 16, .max_model_len = 1024}, 64,
                             false, {256}));
  engine.start();
  auto json_c = guided::json_object_constraint(vocab);
  auto choice_c = guided::choice_constraint(vocab, {"yes", "no", "maybe not"});
  int complete = 0;
  for (int i = 0; i < 16; ++i) {
    SamplingParams p;
    p.temperature = 1.0;
    p.has_seed = true;
    p.seed = uint64_t(i);
    p.max_tokens = 200;
    p.constraint = i % 2 ? choice_c : json_c;
    auto s = engine.submit({1, 2, 3, int32_t(i)}, p);
    std::vector<TokenOutput> out;
    FinishReason f;
    while ((f = s->next(out, 100ms)) == FinishReason::None) {
    }
    std::string text;
    for (const auto& t : out)
      if (t.token != 256) text += char(t.token);
    if (i % 2) {
      EXPECT_EQ(f, FinishReason::Stop);
      EXPECT_TRUE(text == "yes" || text == "no" || text == "maybe not") << text;
    } else if (f == FinishReason::Stop) {
      ++complete;
      EXPECT_TRUE(accepts_complete(text)) << text;
      EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
    } else {
      EXPECT_TRUE(accepts_prefix(text)) << text;  // cut by max_tokens: still a prefix
    }
  }
  EXPECT_GT(complete, 0);
  engine.stop();
}

}  // namespace
}  // namespace sieve::engine
