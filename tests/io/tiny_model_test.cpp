// make-tiny-model: the checkpoint has exactly the published tensor names, shapes and dtypes for
// its config, is a pure function of (options, seed), and its MXFP8 variant dequantizes to the
// BF16 one within fp8 precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/tiny_model.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "/sieve_tiny_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct Expect {
  DType dtype;
  std::vector<int64_t> shape;
};

// Every tensor the published layout has for config `c` (spec §5), BF16 unless noted.
std::map<std::string, Expect> expected_tensors(const ModelConfig& c, const std::string& quant) {
  std::map<std::string, Expect> m;
  const int64_t H = c.hidden_size, D = c.head_dim;
  auto lin = [&](const std::string& base, int64_t rows, int64_t cols) {
    if (quant == "mxfp8") {
      m[base + ".weight"] = {DType::FP8_E4M3, {rows, cols}};
      m[base + ".weight_scale_inv"] = {DType::U8, {rows, (cols + 31) / 32}};
    } else if (quant == "fp8") {
      m[base + ".weight"] = {DType::FP8_E4M3, {rows, cols}};
      m[base + ".weight_scale_inv"] = {DType::F32, {(rows + 127) / 128, (cols + 127) / 128}};
    } else {
      m[base + ".weight"] = {DType::BF16, {rows, cols}};
    }
  };
  const std::string M = "language_model.model.";
  m[M + "embed_tokens.weight"] = {DType::BF16, {c.vocab_size, H}};
  m[M + "norm.weight"] = {DType::BF16, {H}};
  m["language_model.lm_head.weight"] = {DType::BF16, {c.vocab_size, H}};
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    std::string L = M + "layers." + std::to_string(i) + ".";
    m[L + "input_layernorm.weight"] = {DType::BF16, {H}};
    m[L + "post_attention_layernorm.weight"] = {DType::BF16, {H}};
    lin(L + "self_attn.q_proj", c.num_attention_heads * D, H);
    lin(L + "self_attn.k_proj", c.num_key_value_heads * D, H);
    lin(L + "self_attn.v_proj", c.num_key_value_heads * D, H);
    lin(L + "self_attn.o_proj", H, c.num_attention_heads * D);
    m[L + "self_attn.q_norm.weight"] = {DType::BF16, {D}};
    m[L + "self_attn.k_norm.weight"] = {DType::BF16, {D}};
    if (c.is_sparse_layer(i)) {
      lin(L + "self_attn.index_q_proj", int64_t(c.sparse_num_index_heads) * c.sparse_index_dim, H);
      lin(L + "self_attn.index_k_proj", c.sparse_index_dim, H);
      m[L + "self_attn.index_q_norm.weight"] = {DType::BF16, {c.sparse_index_dim}};
      m[L + "self_attn.index_k_norm.weight"] = {DType::BF16, {c.sparse_index_dim}};
    }
    if (c.is_moe_layer(i)) {
      std::string B = L + "block_sparse_moe.";
      m[B + "gate.weight"] = {DType::F32, {c.num_local_experts, H}};
      m[B + "e_score_correction_bias"] = {DType::F32, {c.num_local_experts}};
      for (int e = 0; e < c.num_local_experts; ++e) {
        std::string X = B + "experts." + std::to_string(e) + ".";
        lin(X + "w1", c.intermediate_size, H);
        lin(X + "w3", c.intermediate_size, H);
        lin(X + "w2", H, c.intermediate_size);
      }
      if (c.shared_intermediate_size > 0) {
        lin(B + "shared_experts.gate_proj", c.shared_intermediate_size, H);
        lin(B + "shared_experts.up_proj", c.shared_intermediate_size, H);
        lin(B + "shared_experts.down_proj", H, c.shared_intermediate_size);
      }
    } else {
      lin(L + "mlp.gate_proj", c.dense_intermediate_size, H);
      lin(L + "mlp.up_proj", c.dense_intermediate_size, H);
      lin(L + "mlp.down_proj", H, c.dense_intermediate_size);
    }
  }
  return m;
}

void check_layout(const std::string& dir, const std::string& quant) {
  ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c.model_type, "minimax_m3_vl");
  Checkpoint ck = Checkpoint::open(dir);
  auto want = expected_tensors(c, quant);
  for (const auto& [name, e] : want) {
    ASSERT_TRUE(ck.has(name)) << name;
    EXPECT_EQ(ck.get(name).dtype, e.dtype) << name;
    EXPECT_EQ(ck.get(name).shape, e.shape) << name;
  }
  for (const auto& [name, info] : ck.tensors())
    EXPECT_TRUE(want.count(name)) << "unexpected " << name;
  EXPECT_EQ(ck.tensors().size(), want.size());
}

double stddev(const TensorInfo& t) {
  double s = 0, s2 = 0;
  int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    double v = load_as_f32(t.data, t.dtype, size_t(i));
    s += v;
    s2 += v * v;
  }
  return std::sqrt(std::max(0.0, s2 / double(n) - (s / double(n)) * (s / double(n))));
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

TEST(TinyModel, DefaultLayoutAndConfig) {
  std::string dir = fresh_dir("default");
  TinyModelOptions o;
  o.seed = std::random_device{}();
  write_tiny_model(o, dir);
  EXPECT_TRUE(fs::exists(dir + "/generation_config.json"));
  check_layout(dir, "");
  ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c.num_hidden_layers, 4);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rotary_dim, 32);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.num_local_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.sparse_index_dim, 64);
  EXPECT_EQ(c.sparse_topk_blocks, 2);
  EXPECT_EQ(c.sparse_local_block, 1);
  EXPECT_EQ(c.sparse_init_block, 0);
  EXPECT_EQ(c.sparse_block_size, 128);
  EXPECT_EQ(c.sparse_num_index_heads, 2);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.0f);
  EXPECT_EQ(c.quant_method, "");
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c.is_sparse_layer(i), i > 0);
    EXPECT_EQ(c.is_moe_layer(i), i > 0);
  }

  // Scales that keep activations O(1): projections ~ N(0, 1/sqrt(fan_in)), norms ~ N(0, 0.1).
  Checkpoint ck = Checkpoint::open(dir);
  const std::string L = "language_model.model.layers.1.";
  EXPECT_NEAR(stddev(ck.get(L + "self_attn.q_proj.weight")), 1.0 / std::sqrt(128.0), 0.01);
  EXPECT_NEAR(stddev(ck.get(L + "self_attn.o_proj.weight")), 1.0 / std::sqrt(256.0), 0.01);
  EXPECT_NEAR(stddev(ck.get(L + "block_sparse_moe.experts.3.w2.weight")), 1.0 / 8.0, 0.015);
  EXPECT_NEAR(stddev(ck.get(L + "block_sparse_moe.gate.weight")), 1.0 / std::sqrt(128.0), 0.01);
  EXPECT_NEAR(stddev(ck.get("language_model.model.embed_tokens.weight")), 1.0, 0.03);
  EXPECT_NEAR(stddev(ck.get("language_model.lm_head.weight")), 3.0 / std::sqrt(128.0), 0.02);
  EXPECT_NEAR(stddev(ck.get(L + "input_layernorm.weight")), 0.1, 0.03);
  EXPECT_NEAR(stddev(ck.get(L + "block_sparse_moe.e_score_correction_bias")), 0.1, 0.08);
  // Different tensors are not copies of one stream.
  const TensorInfo& a = ck.get(L + "self_attn.k_proj.weight");
  const TensorInfo& b = ck.get(L + "self_attn.v_proj.weight");
  EXPECT_NE(std::memcmp(a.data, b.data, a.nbytes), 0);
}

TEST(TinyModel, DeterministicPerSeed) {
  TinyModelOptions o;
  o.seed = std::random_device{}();
  std::string d1 = fresh_dir("seed1"), d2 = fresh_dir("seed2"), d3 = fresh_dir("seed3");
  write_tiny_model(o, d1);
  write_tiny_model(o, d2);
  EXPECT_EQ(read_all(d1 + "/model.safetensors"), read_all(d2 + "/model.safetensors"));
  EXPECT_EQ(read_all(d1 + "/config.json"), read_all(d2 + "/config.json"));
  o.seed += 1;
  write_tiny_model(o, d3);
  EXPECT_NE(read_all(d1 + "/model.safetensors"), read_all(d3 + "/model.safetensors"));
}

TEST(TinyModel, CustomLayoutUnlikeM3) {
  // MoE on a dense-attention layer, a dense MLP on a sparse layer, an init block, no shared expert.
  std::string dir = fresh_dir("custom");
  TinyModelOptions o;
  o.seed = std::random_device{}();
  o.num_layers = 5;
  o.sparse_layers = parse_layer_list("1,2,4", 5, "--sparse-layers");
  o.moe_layers = parse_layer_list("0,0,1,1,1", 5, "--moe-layers");  // 0/1 flags
  o.hidden_size = 96;
  o.num_heads = 6;
  o.num_kv_heads = 3;
  o.head_dim = 32;
  o.rotary_dim = 16;
  o.index_dim = 48;
  o.num_experts = 5;
  o.experts_per_tok = 3;
  o.shared_intermediate = 0;
  o.init_blocks = 1;
  o.topk_blocks = 3;
  o.vocab_size = 300;
  write_tiny_model(o, dir);
  check_layout(dir, "");
  ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c.sparse_attention_freq, (std::vector<int>{0, 1, 1, 0, 1}));
  EXPECT_EQ(c.moe_layer_freq, (std::vector<int>{0, 0, 1, 1, 1}));
  EXPECT_EQ(c.sparse_init_block, 1);
  EXPECT_EQ(c.shared_intermediate_size, 0);
  EXPECT_EQ(c.n_shared_experts, 0);
  EXPECT_TRUE(c.is_moe_layer(3) && !c.is_sparse_layer(3));
  EXPECT_TRUE(c.is_sparse_layer(1) && !c.is_moe_layer(1));
  EXPECT_EQ(c.sparse_ordinal(4), 2);

  // A dense model: no sparse layers, no experts.
  std::string dense = fresh_dir("dense");
  TinyModelOptions d;
  d.num_layers = 2;
  d.sparse_layers = parse_layer_list("none", 2, "--sparse-layers");
  d.moe_layers = parse_layer_list("", 2, "--moe-layers");
  write_tiny_model(d, dense);
  check_layout(dense, "");
  ModelConfig dc = load_model_config(dense);
  EXPECT_FALSE(dc.use_sparse_attention);
  EXPECT_EQ(dc.num_local_experts, 0);
}

TEST(TinyModel, Mxfp8DequantizesToTheBf16Weights) {
  TinyModelOptions o;
  o.seed = std::random_device{}();
  o.hidden_size = 80;  // K = 80: the last 1x32 block is partial
  o.dense_intermediate = 96;
  std::string bf = fresh_dir("mx_bf16"), mx = fresh_dir("mx_fp8");
  write_tiny_model(o, bf);
  o.quant = "mxfp8";
  write_tiny_model(o, mx);
  check_layout(mx, "mxfp8");
  ModelConfig c = load_model_config(mx);
  EXPECT_EQ(c.quant_method, "mxfp8");
  EXPECT_FALSE(c.quant_ignored_layers.empty());

  Checkpoint cb = Checkpoint::open(bf), cm = Checkpoint::open(mx);
  int checked = 0;
  for (const auto& [name, w] : cm.tensors()) {
    if (w.dtype != DType::FP8_E4M3) {
      if (cb.has(name) && w.dtype != DType::U8) {  // unquantized tensors are identical
        ASSERT_EQ(w.nbytes, cb.get(name).nbytes);
        EXPECT_EQ(std::memcmp(w.data, cb.get(name).data, w.nbytes), 0) << name;
      }
      continue;
    }
    const TensorInfo& s = cm.get(name.substr(0, name.size() - 7) + ".weight_scale_inv");
    const TensorInfo& ref = cb.get(name);
    int64_t rows = w.shape[0], cols = w.shape[1], kb = s.shape[1];
    const uint8_t* q = static_cast<const uint8_t*>(w.data);
    const uint8_t* sc = static_cast<const uint8_t*>(s.data);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < kb; ++b) {
        float scale = e8m0_to_f32(sc[r * kb + b]);
        float amax = 0;
        for (int64_t k = b * 32; k < std::min(cols, b * 32 + 32); ++k)
          amax =
              std::max(amax, std::fabs(load_as_f32(ref.data, DType::BF16, size_t(r * cols + k))));
        // The scale is the smallest power of two that fits the block in e4m3.
        EXPECT_LE(amax, 448.0f * scale) << name;
        EXPECT_GT(amax, 224.0f * scale) << name;
        for (int64_t k = b * 32; k < std::min(cols, b * 32 + 32); ++k) {
          float deq = fp8e4m3_to_f32(q[r * cols + k]) * scale;
          float want = load_as_f32(ref.data, DType::BF16, size_t(r * cols + k));
          // Half an e4m3 ulp (2^-4 relative) plus the bf16 rounding of the reference, or half
          // the subnormal step (2^-10 * scale) for tiny values.
          float tol =
              std::max(std::fabs(want) * (1.0f / 16 + 1.0f / 256), scale * std::ldexp(1.0f, -10));
          ASSERT_NEAR(deq, want, tol) << name << " [" << r << ", " << k << "]";
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

TEST(TinyModel, ShardedWritesAnIndex) {
  std::string dir = fresh_dir("shards");
  TinyModelOptions o;
  o.seed = std::random_device{}();
  write_tiny_model(o, dir);  // a single file first: it must be replaced, not left beside shards
  o.num_shards = 3;
  write_tiny_model(o, dir);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir + "/model-00003-of-00003.safetensors"));
  check_layout(dir, "");
  std::set<std::string> files;
  Checkpoint ck = Checkpoint::open(dir);
  for (const auto& [name, t] : ck.tensors()) files.insert(t.file);
  EXPECT_EQ(files.size(), 3u);
}

TEST(TinyModel, InvalidOptionsAreErrors) {
  std::string dir = fresh_dir("invalid");
  auto expect_error = [&](TinyModelOptions o, const std::string& part) {
    try {
      write_tiny_model(o, dir);
      ADD_FAILURE() << "no error for " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  TinyModelOptions o;
  o.num_heads = 3;  // not divisible by 2 kv heads
  expect_error(o, "num_attention_heads");
  o = {};
  o.rotary_dim = 33;
  expect_error(o, "rotary_dim");
  o = {};
  o.experts_per_tok = 9;
  expect_error(o, "num_experts_per_tok");
  o = {};
  o.sparse_layers = {1, 0};
  expect_error(o, "sparse layers");
  o = {};
  o.num_shards = 0;
  expect_error(o, "num_shards");

  EXPECT_THROW(parse_layer_list("1,x", 4, "--sparse-layers"), Error);
  EXPECT_THROW(parse_layer_list("7", 4, "--sparse-layers"), Error);
  EXPECT_THROW(parse_layer_list("-1", 4, "--sparse-layers"), Error);
  EXPECT_EQ(parse_layer_list("1,3", 4, "x"), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(parse_layer_list("1,1,0,0", 4, "x"), (std::vector<int>{1, 1, 0, 0}));
  EXPECT_EQ(parse_layer_list("all", 3, "x"), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(parse_layer_list("0", 4, "x"), (std::vector<int>{1, 0, 0, 0}));
}

#ifdef SIEVE_TEST_CLI
// The command line: options reach the files, bad input exits 2 with a one-line error.
int run(const std::string& cmd, std::string* out = nullptr) {
  std::string file = ::testing::TempDir() + "/sieve_tiny_cli_out.txt";
  int rc = std::system((cmd + " >" + file + " 2>&1").c_str());
  if (out) {
    std::ifstream f(file);
    std::stringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
  }
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The Hugging Face block layout: one F32 multiplier per 128x128 block, amax / 448, and every value
// within half an e4m3 ulp of the BF16 weight. Rows and columns that are not whole blocks
// (dense_intermediate 200, hidden 160) give partial blocks.
TEST(TinyModel, BlockFp8DequantizesToTheBf16Weights) {
  TinyModelOptions o;
  o.seed = std::random_device{}();
  o.hidden_size = 160;
  o.dense_intermediate = 200;
  std::string bf = fresh_dir("blk_bf16"), fp = fresh_dir("blk_fp8");
  write_tiny_model(o, bf);
  o.quant = "fp8";
  write_tiny_model(o, fp);
  check_layout(fp, "fp8");
  ModelConfig c = load_model_config(fp);
  EXPECT_EQ(c.quant_method, "fp8");
  EXPECT_EQ(c.quant_block_rows, 128);
  EXPECT_EQ(c.quant_block_cols, 128);
  Checkpoint cb = Checkpoint::open(bf), cf = Checkpoint::open(fp);
  int64_t checked = 0;
  for (const auto& [name, w] : cf.tensors()) {
    if (w.dtype != DType::FP8_E4M3) continue;
    const TensorInfo& s = cf.get(name.substr(0, name.size() - 7) + ".weight_scale_inv");
    const TensorInfo& ref = cb.get(name);
    const int64_t rows = w.shape[0], cols = w.shape[1], kb = s.shape[1];
    const uint8_t* q = static_cast<const uint8_t*>(w.data);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) {
        const float scale = load_as_f32(s.data, DType::F32, size_t((r / 128) * kb + k / 128));
        const float want = load_as_f32(ref.data, DType::BF16, size_t(r * cols + k));
        // Normal codes: e4m3's relative step; subnormal codes: half their spacing (2^-9 of the
        // scale), with room for the float rounding of the products (a draw once landed 1e-13 over).
        const float tol = std::max(std::fabs(want) * (1.0f / 16 + 1.0f / 256), scale * std::ldexp(1.0f, -10) * 1.001f);
        ASSERT_NEAR(fp8e4m3_to_f32(q[r * cols + k]) * scale, want, tol) << name << " [" << r << ", " << k << "]";
        ++checked;
      }
  }
  EXPECT_GT(checked, 100000);
}

TEST(TinyModel, CommandLine) {
  const std::string sieve = std::string(SIEVE_BINARY_DIR) + "/sieve";
  std::string dir = fresh_dir("cli");
  std::string out;
  ASSERT_EQ(run(sieve + " make-tiny-model --out " + dir +
                    " --seed 7 --num-layers 3 --sparse-layers 2 --moe-layers 0,1,1 --hidden-size 64"
                    " --num-heads 2 --num-kv-heads 1 --head-dim 32 --rotary-dim 16 --index-dim 32"
                    " --vocab-size 300 --num-experts 4 --experts-per-tok 1 --topk-blocks 4"
                    " --init-blocks 1 --local-blocks 2 --mxfp8 --shards 2 --eos-token-id 5,6",
                &out),
            0)
      << out;
  ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.sparse_attention_freq, (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(c.moe_layer_freq, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.sparse_topk_blocks, 4);
  EXPECT_EQ(c.sparse_init_block, 1);
  EXPECT_EQ(c.sparse_local_block, 2);
  EXPECT_EQ(c.num_experts_per_tok, 1);
  EXPECT_EQ(c.quant_method, "mxfp8");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{5, 6}));
  check_layout(dir, "mxfp8");

#ifdef SIEVE_TEST_TOKENIZER
  // With the text library the default model also gets a tokenizer, and its bos/eos ids.
  std::string tdir = fresh_dir("cli_tok");
  ASSERT_EQ(run(sieve + " make-tiny-model --out " + tdir, &out), 0) << out;
  EXPECT_TRUE(fs::exists(tdir + "/tokenizer.json"));
  ModelConfig tc = load_model_config(tdir);
  EXPECT_GE(tc.bos_token_id, 256);
  ASSERT_EQ(tc.eos_token_ids.size(), 1u);
  EXPECT_GE(tc.eos_token_ids[0], 256);
  EXPECT_LT(tc.eos_token_ids[0], tc.vocab_size);
  EXPECT_NE(tc.eos_token_ids[0], tc.bos_token_id);
  EXPECT_EQ(run(sieve + " make-tiny-model --out " + tdir + " --vocab-size 200", &out), 2) << out;
  EXPECT_EQ(
      run(sieve + " make-tiny-model --out " + tdir + " --vocab-size 200 --no-tokenizer", &out), 0)
      << out;
#endif

  for (const std::string& bad : std::vector<std::string>{
           " make-tiny-model", " make-tiny-model --out " + dir + " --num-heads 3",
           " make-tiny-model --out " + dir + " --sparse-layers 9",
           " make-tiny-model --out " + dir + " --hidden-size abc",
           " make-tiny-model --out " + dir + " --bogus 1",
           " make-tiny-model --out /proc/sieve_cannot_write_here"}) {
    EXPECT_EQ(run(sieve + bad, &out), 2) << bad << ": " << out;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << bad << ": " << out;
  }
}
#endif

}  // namespace
}  // namespace sieve
