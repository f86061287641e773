// Model config parsing. tests/data/io/minimax_m3_config.json holds the values of spec §1 in the
// published layout (VL wrapper, LLM keys in text_config, nested sparse_attention_config).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "io/config.h"

namespace sieve {
namespace {

using nlohmann::json;

json real_config() {
  std::ifstream f(std::string(SIEVE_TEST_DATA_DIR) + "/io/minimax_m3_config.json");
  EXPECT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

std::vector<int> m3_layers() {
  std::vector<int> v(60, 1);
  v[0] = v[1] = v[2] = 0;
  return v;
}

// Runs `fn` and returns the Error message; fails the test if nothing (or something else) is thrown.
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-Error exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

TEST(Config, RealMiniMaxM3EveryField) {
  ModelConfig c = parse_model_config(real_config());
  EXPECT_EQ(c.model_type, "minimax_m3_vl");
  ASSERT_EQ(c.architectures.size(), 1u);
  EXPECT_EQ(c.architectures[0], "MiniMaxM3SparseForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_hidden_layers, 60);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 200064);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_TRUE(c.use_gemma_norm);
  EXPECT_TRUE(c.use_qk_norm);
  EXPECT_EQ(c.qk_norm_type, "per_head");
  EXPECT_FALSE(c.attention_output_gate);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.hidden_act, "swigluoai");
  EXPECT_FLOAT_EQ(c.swiglu_alpha, 1.702f);
  EXPECT_FLOAT_EQ(c.swiglu_limit, 7.0f);
  EXPECT_FLOAT_EQ(c.swiglu_beta, 1.0f);
  EXPECT_EQ(c.dense_intermediate_size, 12288);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.shared_intermediate_size, 3072);
  EXPECT_EQ(c.num_local_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_TRUE(c.use_routing_bias);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.0f);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_layer_freq, m3_layers());
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 200034);
  ASSERT_EQ(c.eos_token_ids, std::vector<int64_t>{200020});
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_TRUE(c.use_sparse_attention);
  EXPECT_EQ(c.sparse_attention_freq, m3_layers());
  EXPECT_EQ(c.sparse_block_size, 128);
  EXPECT_EQ(c.sparse_num_index_heads, 4);
  EXPECT_EQ(c.sparse_index_dim, 128);
  EXPECT_EQ(c.sparse_topk_blocks, 16);
  EXPECT_EQ(c.sparse_init_block, 0);
  EXPECT_EQ(c.sparse_local_block, 1);
  EXPECT_EQ(c.sparse_score_type, "max");
  EXPECT_EQ(c.sparse_disable_index_value, m3_layers());
  EXPECT_FALSE(c.use_index_cache);
  EXPECT_EQ(c.index_topk_freq, 1);
  EXPECT_EQ(c.index_topk_pattern, "");
  EXPECT_EQ(c.index_skip_topk_offset, 0);
  EXPECT_EQ(c.quant_method, "");
  EXPECT_TRUE(c.quant_ignored_layers.empty());
  EXPECT_EQ(c.raw.at("num_mtp_modules"), 7);  // unmodelled keys stay reachable

  int sparse = 0, moe = 0;
  for (int i = 0; i < 60; ++i) {
    EXPECT_EQ(c.is_sparse_layer(i), i >= 3) << i;
    EXPECT_EQ(c.is_moe_layer(i), i >= 3) << i;
    EXPECT_EQ(c.sparse_ordinal(i), i >= 3 ? i - 3 : -1) << i;
    EXPECT_FALSE(c.shares_index_topk(i)) << i;
    sparse += c.is_sparse_layer(i);
    moe += c.is_moe_layer(i);
  }
  EXPECT_EQ(sparse, 57);
  EXPECT_EQ(moe, 57);
  EXPECT_FALSE(c.is_sparse_layer(60));
  EXPECT_FALSE(c.is_sparse_layer(-1));
}

TEST(Config, LoadFromDirectory) {
  std::string dir = ::testing::TempDir() + "/sieve_config_dir";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/config.json");
    f << real_config().dump();
  }
  ModelConfig c = load_model_config(dir, R"({"use_index_cache": true})");
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_TRUE(c.use_index_cache);
  {
    std::ofstream f(dir + "/config.json");
    f << "{\"text_config\": {";  // truncated
  }
  std::string msg = error_of([&] { load_model_config(dir); });
  EXPECT_NE(msg.find(dir + "/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
  std::string missing = ::testing::TempDir() + "/sieve_no_such_model_dir";
  msg = error_of([&] { load_model_config(missing); });
  EXPECT_NE(msg.find(missing + "/config.json"), std::string::npos) << msg;
}

TEST(Config, IndexCacheFrequencyFour) {
  ModelConfig c =
      parse_model_config(real_config(), R"({"use_index_cache": true, "index_topk_freq": 4})");
  EXPECT_TRUE(c.use_index_cache);
  EXPECT_EQ(c.index_topk_freq, 4);
  std::vector<int> full;
  for (int i = 0; i < 60; ++i) {
    if (!c.is_sparse_layer(i)) {
      EXPECT_FALSE(c.shares_index_topk(i));
      continue;
    }
    if (!c.shares_index_topk(i)) full.push_back(c.sparse_ordinal(i));
  }
  std::vector<int> expect;
  for (int o = 0; o <= 56; o += 4) expect.push_back(o);
  EXPECT_EQ(full, expect);
  EXPECT_EQ(full.size(), 15u);
  // Absolute layers 3, 7, ..., 59 compute; 4, 5, 6 share.
  EXPECT_FALSE(c.shares_index_topk(3));
  EXPECT_TRUE(c.shares_index_topk(4));
  EXPECT_TRUE(c.shares_index_topk(6));
  EXPECT_FALSE(c.shares_index_topk(7));
  EXPECT_FALSE(c.shares_index_topk(59));
  // Without use_index_cache the frequency has no effect.
  ModelConfig off = parse_model_config(real_config(), R"({"index_topk_freq": 4})");
  for (int i = 0; i < 60; ++i) EXPECT_FALSE(off.shares_index_topk(i));
}

TEST(Config, IndexCacheOffsetMatchesRule) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 20; ++trial) {
    int f = 1 + int(rng() % 6), off = int(rng() % 9);
    json ov = {{"use_index_cache", true}, {"index_topk_freq", f}, {"index_skip_topk_offset", off}};
    ModelConfig c = parse_model_config(real_config(), ov.dump());
    for (int o = 0; o < 57; ++o) {
      bool shared = f > 1 && std::max(o - off, 0) % f != 0;
      EXPECT_EQ(c.shares_index_topk(o + 3), shared) << "f=" << f << " off=" << off << " o=" << o;
    }
  }
  // Offset 2, freq 3: ordinals 0, 1, 2 (max(o-2,0) = 0) are Full, 3 and 4 Shared, 5 Full.
  ModelConfig c = parse_model_config(
      real_config(),
      R"({"use_index_cache": true, "index_topk_freq": 3, "index_skip_topk_offset": 2})");
  std::vector<bool> got;
  for (int o = 0; o < 6; ++o) got.push_back(c.shares_index_topk(o + 3));
  EXPECT_EQ(got, (std::vector<bool>{false, false, false, true, true, false}));
}

TEST(Config, IndexCachePattern) {
  ModelConfig c = parse_model_config(
      real_config(),
      R"({"use_index_cache": true, "index_topk_freq": 4, "index_topk_pattern": "FSSFFS"})");
  EXPECT_EQ(c.index_topk_pattern, "FSSFFS");
  // The pattern wins over the frequency; ordinals past its end are Full.
  std::vector<bool> expect = {false, true, true, false, false, true};
  for (int o = 0; o < 57; ++o)
    EXPECT_EQ(c.shares_index_topk(o + 3), o < 6 ? bool(expect[size_t(o)]) : false) << o;
}

TEST(Config, OverridesAnyKeyAndNestedSparse) {
  // Flat sparse key goes inside sparse_attention_config; nested objects merge key by key.
  ModelConfig c = parse_model_config(
      real_config(),
      R"({"sparse_topk_blocks": 8, "sparse_attention_config": {"sparse_init_block": 1},
          "rope_theta": 10000, "text_config": {"num_experts_per_tok": 2}})");
  EXPECT_EQ(c.sparse_topk_blocks, 8);
  EXPECT_EQ(c.sparse_init_block, 1);
  EXPECT_EQ(c.sparse_local_block, 1);  // untouched sibling kept
  EXPECT_EQ(c.sparse_attention_freq, m3_layers());
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.raw["sparse_attention_config"]["sparse_topk_blocks"], 8);
  EXPECT_FALSE(c.raw.contains("sparse_topk_blocks"));
}

TEST(Config, PlainTextConfig) {
  json t = real_config()["text_config"];
  // Flat sparse keys, no rotary_dim (from partial_rotary_factor), moe_layer_freq as an int,
  // no head_dim (hidden / heads), eos as a list.
  json sparse = t["sparse_attention_config"];
  t.erase("sparse_attention_config");
  for (auto it = sparse.begin(); it != sparse.end(); ++it) t[it.key()] = it.value();
  t.erase("rotary_dim");
  t.erase("head_dim");
  t["hidden_size"] = 8192;  // 8192 / 64 = 128
  t["moe_layer_freq"] = 2;
  t["first_k_dense_replace"] = 3;
  t["eos_token_id"] = {200020, 7};
  t["sparse_topk_blocks"] = 4;
  ModelConfig c = parse_model_config(t, R"({"sparse_local_block": 2})", "plain.json");
  EXPECT_EQ(c.model_type, "minimax_m3");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.sparse_topk_blocks, 4);
  EXPECT_EQ(c.sparse_local_block, 2);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{200020, 7}));
  for (int i = 0; i < 60; ++i) EXPECT_EQ(c.is_moe_layer(i), i >= 3 && i % 2 == 0) << i;
  EXPECT_EQ(c.sparse_attention_freq, m3_layers());

  // Keys left to their defaults.
  json minimal = {{"hidden_size", 256},
                  {"num_hidden_layers", 2},
                  {"num_attention_heads", 4},
                  {"vocab_size", 100},
                  {"intermediate_size", 64}};
  ModelConfig m = parse_model_config(minimal);
  EXPECT_EQ(m.num_key_value_heads, 4);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.rotary_dim, 64);
  EXPECT_FALSE(m.use_sparse_attention);
  EXPECT_FALSE(m.is_sparse_layer(0));
  EXPECT_FALSE(m.is_moe_layer(0));
  EXPECT_EQ(m.dense_intermediate_size, 64);
  EXPECT_EQ(m.sparse_block_size, 128);
  EXPECT_EQ(m.sparse_ordinal(1), -1);
}

// A few layers of the real model (one GPU's worth): overriding num_hidden_layers keeps the first
// entries of the per-layer lists, unless the override gives the lists too.
TEST(Config, FewerLayersKeepThePublishedLayout) {
  ModelConfig c = parse_model_config(real_config(), R"({"num_hidden_layers": 5})");
  EXPECT_EQ(c.num_hidden_layers, 5);
  EXPECT_EQ(c.moe_layer_freq, (std::vector<int>{0, 0, 0, 1, 1}));
  EXPECT_EQ(c.sparse_attention_freq, (std::vector<int>{0, 0, 0, 1, 1}));
  EXPECT_EQ(c.sparse_disable_index_value.size(), 5u);
  ModelConfig d = parse_model_config(real_config(), R"({"num_hidden_layers": 2, "moe_layer_freq": [1, 1]})");
  EXPECT_EQ(d.moe_layer_freq, (std::vector<int>{1, 1}));
  EXPECT_EQ(d.sparse_attention_freq, (std::vector<int>{0, 0}));
  std::string msg = error_of([&] { parse_model_config(real_config(), R"({"num_hidden_layers": 2, "moe_layer_freq": [1]})"); });
  EXPECT_NE(msg.find("moe_layer_freq"), std::string::npos) << msg;
}

TEST(Config, RoundTripThroughJson) {
  ModelConfig c = parse_model_config(
      real_config(),
      R"({"use_index_cache": true, "index_topk_pattern": "FSS", "sparse_topk_blocks": 2})");
  json j = model_config_to_json(c);
  EXPECT_EQ(j["model_type"], "minimax_m3_vl");
  ASSERT_TRUE(j["text_config"].contains("sparse_attention_config"));
  ModelConfig d = parse_model_config(j);
  EXPECT_EQ(d.hidden_size, c.hidden_size);
  EXPECT_EQ(d.rotary_dim, c.rotary_dim);
  EXPECT_EQ(d.moe_layer_freq, c.moe_layer_freq);
  EXPECT_EQ(d.sparse_attention_freq, c.sparse_attention_freq);
  EXPECT_EQ(d.sparse_topk_blocks, 2);
  EXPECT_EQ(d.index_topk_pattern, "FSS");
  EXPECT_TRUE(d.use_index_cache);
  EXPECT_FLOAT_EQ(d.routed_scaling_factor, 2.0f);
  EXPECT_EQ(d.eos_token_ids, c.eos_token_ids);
  EXPECT_EQ(d.bos_token_id, c.bos_token_id);
}

TEST(Config, Mxfp8QuantizationConfig) {
  json j = real_config();
  j["quantization_config"] = {
      {"quant_method", "mxfp8"},
      {"activation_scheme", "dynamic"},
      {"weight_block_size", {1, 32}},
      {"ignored_layers", {"lm_head", "model.embed_tokens", "vision_tower"}}};
  ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.quant_method, "mxfp8");
  EXPECT_EQ(c.quant_ignored_layers,
            (std::vector<std::string>{"lm_head", "model.embed_tokens", "vision_tower"}));
  ModelConfig d = parse_model_config(model_config_to_json(c));
  EXPECT_EQ(d.quant_method, "mxfp8");
  EXPECT_EQ(d.quant_ignored_layers, c.quant_ignored_layers);

  j["quantization_config"]["quant_method"] = "awq";
  std::string msg = error_of([&] { parse_model_config(j); });
  EXPECT_NE(msg.find("quantization_config.quant_method"), std::string::npos) << msg;
  EXPECT_NE(msg.find("awq"), std::string::npos) << msg;
}

struct BadCase {
  std::string overrides;
  std::vector<std::string> must_contain;
};

TEST(Config, ValidationErrorsNameKeyAndExpectation) {
  std::vector<BadCase> cases = {
      {R"({"sparse_block_size": 64})",
       {"sparse_block_size", "64", "block size 128 is required for sparse models"}},
      {R"({"sparse_score_type": "mean"})", {"sparse_score_type", "mean", "max"}},
      {R"({"sparse_num_index_heads": 8})",
       {"sparse_num_index_heads", "8", "num_key_value_heads = 4"}},
      {R"({"sparse_attention_freq": [0, 1, 1]})", {"sparse_attention_freq", "3 entries", "60"}},
      {R"({"sparse_disable_index_value": [1, 1]})",
       {"sparse_disable_index_value", "2 entries", "60"}},
      {R"({"moe_layer_freq": [1, 1, 1, 1]})", {"moe_layer_freq", "4 entries", "60"}},
      {R"({"num_key_value_heads": 5, "sparse_num_index_heads": 5})",
       {"num_attention_heads", "64", "num_key_value_heads = 5"}},
      {R"({"rotary_dim": 63})", {"rotary_dim", "63", "even"}},
      {R"({"rotary_dim": 256})", {"rotary_dim", "256", "head_dim = 128"}},
      {R"({"index_topk_freq": 0})", {"index_topk_freq", "0", ">= 1"}},
      {R"({"index_topk_pattern": "FSX"})", {"index_topk_pattern", "FSX", "'F' and 'S'"}},
      {R"({"index_topk_pattern": "SF"})", {"index_topk_pattern", "SF", "first sparse layer"}},
      {R"({"index_skip_topk_offset": -1})", {"index_skip_topk_offset", "-1"}},
      {R"({"hidden_size": "big"})", {"hidden_size", "string", "integer"}},
      {R"({"num_experts_per_tok": 0})", {"num_experts_per_tok", "0"}},
      {R"({"sparse_topk_blocks": 0})", {"sparse_topk_blocks", "0", ">= 1"}},
      {R"({"eos_token_id": "x"})", {"eos_token_id", "integer"}},
      {R"({"hidden_act": "gelu"})", {"hidden_act", "gelu", "swigluoai"}},
  };
  for (const auto& bc : cases) {
    std::string msg =
        error_of([&] { parse_model_config(real_config(), bc.overrides, "m3/config.json"); });
    EXPECT_EQ(msg.find("m3/config.json"), 0u) << bc.overrides << " -> " << msg;
    for (const auto& s : bc.must_contain)
      EXPECT_NE(msg.find(s), std::string::npos)
          << bc.overrides << " -> " << msg << " (missing '" << s << "')";
  }
}

TEST(Config, MissingRequiredKeys) {
  for (const char* key :
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"}) {
    json j = real_config();
    j["text_config"].erase(key);
    std::string msg = error_of([&] { parse_model_config(j); });
    EXPECT_NE(msg.find(std::string("text_config.") + key), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  }
  // A null text_config, or a top level that is not an object.
  std::string msg = error_of([&] { parse_model_config(json::array({1, 2})); });
  EXPECT_NE(msg.find("object"), std::string::npos) << msg;
  json j = real_config();
  j["text_config"] = 3;
  msg = error_of([&] { parse_model_config(j); });
  EXPECT_NE(msg.find("text_config"), std::string::npos) << msg;
}

TEST(Config, InvalidOverrides) {
  std::string msg =
      error_of([&] { parse_model_config(real_config(), "{\"use_index_cache\": tru"); });
  EXPECT_EQ(msg.find("--hf-overrides"), 0u) << msg;
  EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
  msg = error_of([&] { parse_model_config(real_config(), "[1, 2]"); });
  EXPECT_EQ(msg.find("--hf-overrides"), 0u) << msg;
  EXPECT_NE(msg.find("object"), std::string::npos) << msg;
  msg = error_of([&] { parse_model_config(real_config(), "4"); });
  EXPECT_EQ(msg.find("--hf-overrides"), 0u) << msg;
}

// Random garbage as overrides or config values: an Error or a valid config, never anything else.
TEST(Config, RandomOverridesNeverCrash) {
  std::mt19937 rng(std::random_device{}());
  std::vector<std::string> keys = {"hidden_size",
                                   "num_hidden_layers",
                                   "num_attention_heads",
                                   "num_key_value_heads",
                                   "head_dim",
                                   "rotary_dim",
                                   "moe_layer_freq",
                                   "sparse_attention_freq",
                                   "sparse_topk_blocks",
                                   "index_topk_pattern",
                                   "eos_token_id",
                                   "num_local_experts",
                                   "num_experts_per_tok",
                                   "sparse_attention_config",
                                   "text_config"};
  std::vector<json> values = {
      json(nullptr),  json(-1),   json(0),    json(1),        json(3),
      json(1e30),     json("S"),  json("FS"), json::array(),  json::array({1, 0}),
      json::object(), json(true), json(2.5),  json(INT64_MAX)};
  int ok = 0, err = 0;
  for (int i = 0; i < 500; ++i) {
    json ov = json::object();
    int n = 1 + int(rng() % 3);
    for (int k = 0; k < n; ++k) ov[keys[rng() % keys.size()]] = values[rng() % values.size()];
    try {
      ModelConfig c = parse_model_config(real_config(), ov.dump());
      for (int l = 0; l < c.num_hidden_layers; ++l) (void)c.shares_index_topk(l);
      ++ok;
    } catch (const Error&) {
      ++err;
    }
  }
  EXPECT_GT(err, 0);
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace sieve

namespace sieve {
namespace {

TEST(Config, GenerationConfigAddsEosIds) {
  std::string dir = ::testing::TempDir() + "/sieve_config_gen";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << real_config().dump();
  std::ofstream(dir + "/generation_config.json")
      << R"({"eos_token_id": [200020, 200021], "bos_token_id": 1})";
  ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{200020, 200021}));  // no duplicate 200020
  EXPECT_EQ(c.bos_token_id, 200034);                                   // config.json wins
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": "x"})";
  std::string msg = error_of([&] { load_model_config(dir); });
  EXPECT_NE(msg.find("generation_config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("eos_token_id"), std::string::npos) << msg;
  std::ofstream(dir + "/generation_config.json") << "{";
  msg = error_of([&] { load_model_config(dir); });
  EXPECT_NE(msg.find("generation_config.json"), std::string::npos) << msg;
  std::filesystem::remove(dir + "/generation_config.json");
  EXPECT_EQ(load_model_config(dir).eos_token_ids, (std::vector<int64_t>{200020}));
}

// Random byte edits of the config text: an Error naming the file or a config, never a crash.
TEST(Config, RandomlyCorruptedFileNeverCrashes) {
  std::mt19937 rng(std::random_device{}());
  std::string dir = ::testing::TempDir() + "/sieve_config_fuzz";
  std::filesystem::create_directories(dir);
  const std::string text = real_config()["text_config"].dump();
  int ok = 0, err = 0;
  for (int i = 0; i < 1000; ++i) {
    std::string t = text;
    for (int e = 0, n = 1 + int(rng() % 3); e < n; ++e) {
      size_t pos = rng() % t.size();
      if (rng() % 8 == 0)
        t.resize(pos);
      else
        t[pos] = "0123456789[]{},:\"-eE.SFtruefalsn "[rng() % 34];
      if (t.empty()) break;
    }
    std::ofstream(dir + "/config.json", std::ios::trunc) << t;
    try {
      ModelConfig c = load_model_config(dir);
      for (int l = 0; l < c.num_hidden_layers; ++l) (void)c.shares_index_topk(l);
      ++ok;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find(dir + "/config.json"), std::string::npos) << e.what();
      ++err;
    }
  }
  EXPECT_GT(err, 100);
  EXPECT_GT(ok, 10);
}

}  // namespace
}  // namespace sieve
