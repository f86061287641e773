// Prefix caching is exact on the real model: a request that reuses cached KV and index-key
// blocks gives the same greedy tokens and the same log-probs, bit for bit, as the same request
// computed from nothing. Checked with the shared prefix ending at, before and after every block
// boundary, with bf16 and fp8 caches, with index top-k sharing across layers (use_index_cache),
// while other requests run, and under preemption (a preempted request finds its own blocks).
// Speculative decoding has no rows here yet: there is no proposer to verify with.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "engine/engine.h"
#include "io/tiny_model.h"
#include "model/model.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct CacheSetup {
  const char* name;
  DType kv, index;
  bool
      share_index;  // use_index_cache with index_topk_freq 2: every other sparse layer reuses top-k
};

void PrintTo(const CacheSetup& s, std::ostream* os) {
  *os << s.name;
}

const CacheSetup kSetups[] = {{"bf16", DType::BF16, DType::BF16, false},
                              {"fp8", DType::FP8_E4M3, DType::FP8_E4M3, false},
                              {"bf16_shared_index", DType::BF16, DType::BF16, true},
                              {"fp8_shared_index", DType::FP8_E4M3, DType::FP8_E4M3, true}};

// One random tiny model for the whole file: 5 layers (1 dense, 4 sparse + MoE); sparse layers
// keep 2 of their blocks (the local one and the best other), so a prompt of 3 blocks or more
// depends on the index keys read back from the cache.
fs::path model_path() {
  return fs::temp_directory_path() / ("sieve_prefix_cache_test_" + std::to_string(::getpid()));
}

class RemoveModel : public ::testing::Environment {
  void TearDown() override { fs::remove_all(model_path()); }
};
const auto* const remove_model = ::testing::AddGlobalTestEnvironment(new RemoveModel);

const std::string& model_dir() {
  static const std::string dir = [] {
    fs::path p = model_path();
    fs::remove_all(p);
    TinyModelOptions o;
    o.seed = 11;
    o.num_layers = 5;
    o.topk_blocks = 2;
    o.vocab_size = 384;
    write_tiny_model(o, p.string());
    return p.string();
  }();
  return dir;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<engine::TokenLogprob>> top;
};

Result collect(engine::RequestStream& s) {
  Result r;
  std::vector<engine::TokenOutput> out;
  while (s.next(out, 100ms) == engine::FinishReason::None) {
  }
  for (auto& t : out) {
    r.tokens.push_back(t.token);
    r.logprobs.push_back(t.logprob);
    r.top.push_back(t.top);
  }
  return r;
}

engine::SamplingParams greedy(int64_t max_tokens) {
  engine::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = true;
  p.top_logprobs = 5;
  return p;
}

// A model with its caches and an engine over them.
struct Rig {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<engine::Engine> engine;
  Rig(const CacheSetup& s, bool caching, int64_t num_blocks = 64, int64_t batched = 8192) {
    model::LoadOptions lo;
    if (s.share_index) lo.hf_overrides = R"({"use_index_cache": true, "index_topk_freq": 2})";
    model = model::Model::load(model_dir(), lo);
    model::CacheOptions co;
    co.kv_dtype = s.kv;
    co.index_dtype = s.index;
    co.num_blocks = num_blocks;
    model->allocate_caches(co);
    engine::EngineConfig ec;
    ec.scheduler = {.max_num_batched_tokens = batched,
                    .max_num_seqs = 16,
                    .max_model_len = std::min<int64_t>(4096, num_blocks * model->block_size())};
    ec.num_blocks = num_blocks;
    ec.enable_prefix_caching = caching;
    engine = std::make_unique<engine::Engine>(*model, ec);
    engine->start();
  }
  ~Rig() { engine->stop(); }
  Result run(const std::vector<int32_t>& prompt, int64_t max_tokens) {
    return collect(*engine->submit(prompt, greedy(max_tokens)));
  }
};

std::vector<int32_t> random_ids(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, 383);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void expect_same(const Result& warm, const Result& cold, const std::string& what) {
  ASSERT_EQ(warm.tokens, cold.tokens) << what;
  ASSERT_EQ(warm.logprobs.size(), cold.logprobs.size()) << what;
  for (size_t i = 0; i < cold.logprobs.size(); ++i) {
    // Bit-equal: the cached blocks hold exactly what recomputing them writes.
    EXPECT_EQ(warm.logprobs[i], cold.logprobs[i]) << what << ", token " << i;
    ASSERT_EQ(warm.top[i].size(), cold.top[i].size()) << what;
    for (size_t k = 0; k < cold.top[i].size(); ++k) {
      EXPECT_EQ(warm.top[i][k].token, cold.top[i][k].token)
          << what << ", token " << i << " alt " << k;
      EXPECT_EQ(warm.top[i][k].logprob, cold.top[i][k].logprob)
          << what << ", token " << i << " alt " << k;
    }
  }
}

class PrefixCache : public ::testing::TestWithParam<CacheSetup> {};

// The primer (4 blocks and a bit) is computed first; each target shares its first L tokens and
// then goes its own way, for L on both sides of every block boundary, so the cached prefix it
// finds ends at each boundary and its own computation starts just before, at or after it. Its
// prompt ends at a boundary or 5 tokens before one, so its decode starts a block or crosses into
// one.
TEST_P(PrefixCache, WarmEqualsColdAtEveryBlockBoundary) {
  const CacheSetup& s = GetParam();
  const int B = 128;
  const std::vector<int32_t> primer = random_ids(4 * B + 40, 1);
  Rig warm(s, true);
  Rig cold(s, false);
  warm.run(primer, 1);
  uint64_t seed = 100;
  int cases = 0;
  for (int k = 1; k <= 4; ++k)
    for (int off : {-1, 0, 1}) {
      const int L = k * B + off;
      const int to_boundary = B - L % B;
      // Tail 0 ends the prompt with the primer's own block: the last token of a cached block is
      // then computed again (one token always is).
      for (int tail : {0, to_boundary, to_boundary > 5 ? to_boundary - 5 : to_boundary + B - 5}) {
        if (tail == 0 && off != 0) continue;
        std::vector<int32_t> prompt(primer.begin(), primer.begin() + L);
        const auto extra = random_ids(size_t(tail), ++seed);
        prompt.insert(prompt.end(), extra.begin(), extra.end());
        const std::string what = std::string(s.name) + ": shared prefix " + std::to_string(L) +
                                 ", prompt " + std::to_string(prompt.size());
        const uint64_t hits0 = warm.engine->stats().prefix_hit_tokens;
        const Result w = warm.run(prompt, 8);
        const uint64_t hit = warm.engine->stats().prefix_hit_tokens - hits0;
        // Whole blocks of the shared part, never the prompt's last token.
        const int64_t want = std::min<int64_t>(L, int64_t(prompt.size()) - 1) / B * B;
        EXPECT_EQ(int64_t(hit), want) << what;
        expect_same(w, cold.run(prompt, 8), what);
        ++cases;
      }
    }
  EXPECT_EQ(cases, 4 * 7);
  EXPECT_EQ(cold.engine->stats().prefix_query_tokens, 0u);  // the reference computed everything
}

// Several requests with one long shared prefix at once (their prefills mixed with each other's
// decodes, in chunks), then again when the prefix is cached: every output equals its solo run.
TEST_P(PrefixCache, SharedPrefixUnderLoad) {
  const CacheSetup& s = GetParam();
  const int B = 128;
  const std::vector<int32_t> system = random_ids(2 * B + 50, 2);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) {
    auto p = system;
    const auto q = random_ids(size_t(10 + 29 * i), 200 + uint64_t(i));
    p.insert(p.end(), q.begin(), q.end());
    prompts.push_back(p);
  }
  std::vector<Result> solo;
  {
    Rig cold(s, false);
    for (const auto& p : prompts) solo.push_back(cold.run(p, 20));
  }
  Rig warm(s, true, 64, 200);  // 200-token steps: prefills in chunks beside the decodes
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    for (const auto& p : prompts) streams.push_back(warm.engine->submit(p, greedy(20)));
    for (size_t i = 0; i < prompts.size(); ++i)
      expect_same(collect(*streams[i]), solo[i],
                  std::string(s.name) + ": round " + std::to_string(round) + ", request " +
                      std::to_string(i));
  }
  EXPECT_GE(warm.engine->stats().prefix_hit_tokens, uint64_t(5 * 2 * B));
}

// A cache too small for every request at once: requests are preempted and recomputed, and with
// prefix caching a preempted request finds its own blocks (prompt and generated tokens) again.
TEST_P(PrefixCache, PreemptedRequestsReuseTheirBlocks) {
  const CacheSetup& s = GetParam();
  const int B = 128;
  // One shared block, then 2 blocks' worth per request; the decode needs a third block each.
  const std::vector<int32_t> shared = random_ids(B + 20, 3);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    auto p = shared;
    const auto q = random_ids(size_t(B - 40 + 5 * i), 300 + uint64_t(i));
    p.insert(p.end(), q.begin(), q.end());
    prompts.push_back(p);
  }
  const int64_t gen = 64;
  std::vector<Result> solo;
  {
    Rig cold(s, false);
    for (const auto& p : prompts) solo.push_back(cold.run(p, gen));
  }
  // 7 blocks: the prompts fit (1 shared + 4), their decodes do not (4 more).
  Rig tight(s, true, 7, 256);
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const auto& p : prompts) streams.push_back(tight.engine->submit(p, greedy(gen)));
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_same(collect(*streams[i]), solo[i],
                std::string(s.name) + ": request " + std::to_string(i));
  const engine::EngineStats st = tight.engine->stats();
  EXPECT_GT(st.preemptions, 0u);
  EXPECT_GT(st.prefix_hit_tokens, 0u);
}

INSTANTIATE_TEST_SUITE_P(Caches, PrefixCache, ::testing::ValuesIn(kSetups),
                         [](const auto& info) { return std::string(info.param.name); });

// A warm shared prefix cuts the time to first token: the engine's own TTFT (arrival to first
// token) of a prompt whose 16 leading blocks are cached, against the same-length prompt computed
// whole. A ratio of two times measured the same way, each the best of three, not a time.
TEST(PrefixCacheTiming, WarmPrefixCutsTimeToFirstToken) {
  const CacheSetup s = kSetups[0];
  const int B = 128;
  const std::vector<int32_t> prefix = random_ids(16 * B, 4);
  Rig rig(s, true, 96);
  auto ttft = [&](const std::vector<int32_t>& prompt) {
    const engine::EngineStats before = rig.engine->stats();
    rig.run(prompt, 1);
    const engine::EngineStats after = rig.engine->stats();
    EXPECT_EQ(after.ttft.count, before.ttft.count + 1);
    return after.ttft.sum - before.ttft.sum;
  };
  double cold = 1e30, warm = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    // Cold: a prefix nobody computed yet. Warm: the cached one with a new last token.
    auto fresh = random_ids(16 * B + 1, 500 + uint64_t(rep));
    const uint64_t h0 = rig.engine->stats().prefix_hit_tokens;
    cold = std::min(cold, ttft(fresh));
    EXPECT_EQ(rig.engine->stats().prefix_hit_tokens, h0) << "the cold prompt found nothing cached";
    if (rep == 0)
      rig.run(
          [&] {
            auto p = prefix;
            p.push_back(7);
            return p;
          }(),
          1);  // caches the prefix
    auto p = prefix;
    p.push_back(20 + rep);
    const uint64_t h1 = rig.engine->stats().prefix_hit_tokens;
    warm = std::min(warm, ttft(p));
    EXPECT_EQ(rig.engine->stats().prefix_hit_tokens - h1, uint64_t(16 * B));
  }
  RecordProperty("cold_ttft_ms", std::to_string(cold * 1e3));
  RecordProperty("warm_ttft_ms", std::to_string(warm * 1e3));
  // 2049 tokens against 1: far more than 2x apart on any machine.
  EXPECT_LT(warm, 0.5 * cold) << "cold " << cold * 1e3 << " ms, warm " << warm * 1e3 << " ms";
}

}  // namespace
}  // namespace sieve
