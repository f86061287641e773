#include "io/tiny_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "core/splitmix.h"
#include "io/safetensors.h"

namespace sieve {

namespace {

using nlohmann::json;

using Rng = SplitMix64;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::vector<float> normal_values(uint64_t seed, const std::string& name, size_t n, double mean,
                                 double std) {
  Rng r{seed * 0x9e3779b97f4a7c15ull ^ fnv1a(name)};
  std::vector<float> v(n);
  for (auto& x : v) x = float(mean + std * r.normal());
  return v;
}

TensorToWrite to_tensor(const std::string& name, DType dt, std::vector<int64_t> shape,
                        const std::vector<float>& v) {
  TensorToWrite t{name, dt, std::move(shape), std::vector<uint8_t>(v.size() * dtype_size(dt))};
  for (size_t i = 0; i < v.size(); ++i) store_from_f32(t.bytes.data(), dt, i, v[i]);
  return t;
}

// MXFP8: per row, one E8M0 scale per 32 columns chosen so the block's amax fits in e4m3
// (scale = 2^ceil(log2(amax / 448))), elements rounded to nearest even.
void add_mxfp8(std::vector<TensorToWrite>& out, const std::string& base, int64_t rows, int64_t cols,
               const std::vector<float>& v) {
  int64_t kb = (cols + 31) / 32;
  TensorToWrite w{
      base + ".weight", DType::FP8_E4M3, {rows, cols}, std::vector<uint8_t>(size_t(rows * cols))};
  TensorToWrite s{
      base + ".weight_scale_inv", DType::U8, {rows, kb}, std::vector<uint8_t>(size_t(rows * kb))};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < kb; ++b) {
      int64_t c0 = b * 32, c1 = std::min(cols, c0 + 32);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[size_t(r * cols + c)]));
      int e = -127;
      if (amax > 0.0f) e = std::clamp(int(std::ceil(std::log2(double(amax) / 448.0))), -127, 127);
      s.bytes[size_t(r * kb + b)] = uint8_t(e + 127);
      float inv = std::ldexp(1.0f, -e);
      for (int64_t c = c0; c < c1; ++c)
        w.bytes[size_t(r * cols + c)] = f32_to_fp8e4m3(v[size_t(r * cols + c)] * inv);
    }
  }
  out.push_back(std::move(w));
  out.push_back(std::move(s));
}

// Hugging Face block fp8: per 128x128 block scale = amax / 448 (1 when 0), stored as the F32
// multiplier `weight_scale_inv` [ceil(rows / 128), ceil(cols / 128)].
void add_block_fp8(std::vector<TensorToWrite>& out, const std::string& base, int64_t rows, int64_t cols,
                   const std::vector<float>& v) {
  const int64_t rb = (rows + 127) / 128, kb = (cols + 127) / 128;
  TensorToWrite w{
      base + ".weight", DType::FP8_E4M3, {rows, cols}, std::vector<uint8_t>(size_t(rows * cols))};
  std::vector<float> scales(size_t(rb * kb));
  for (int64_t b = 0; b < rb; ++b)
    for (int64_t k = 0; k < kb; ++k) {
      float amax = 0.0f;
      for (int64_t r = b * 128; r < std::min(rows, b * 128 + 128); ++r)
        for (int64_t c = k * 128; c < std::min(cols, k * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(v[size_t(r * cols + c)]));
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      scales[size_t(b * kb + k)] = scale;
      for (int64_t r = b * 128; r < std::min(rows, b * 128 + 128); ++r)
        for (int64_t c = k * 128; c < std::min(cols, k * 128 + 128); ++c)
          w.bytes[size_t(r * cols + c)] = f32_to_fp8e4m3(v[size_t(r * cols + c)] / scale);
    }
  out.push_back(std::move(w));
  out.push_back(to_tensor(base + ".weight_scale_inv", DType::F32, {rb, kb}, scales));
}

std::vector<int> default_or(const std::vector<int>& given, int n, const char* what) {
  if (given.empty()) {
    std::vector<int> v(size_t(n), 1);
    if (n > 0) v[0] = 0;
    return v;
  }
  if (int(given.size()) != n)
    throw Error(std::string(what) + ": " + std::to_string(given.size()) +
                " flags given, expected one per layer (" + std::to_string(n) + ")");
  return given;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.flush();
  if (!f) throw Error(path + ": cannot write");
}

}  // namespace

std::vector<int> parse_layer_list(const std::string& text, int num_layers,
                                  const std::string& what) {
  std::vector<int> flags(size_t(std::max(num_layers, 0)), 0);
  if (text.empty() || text == "none") return flags;
  if (text == "all") return std::vector<int>(flags.size(), 1);
  std::vector<long long> items;
  std::stringstream ss(text);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    tok.erase(0, tok.find_first_not_of(" \t"));
    tok.erase(tok.find_last_not_of(" \t") + 1);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (tok.empty() || used != tok.size() || v < 0)
      throw Error(what + ": \"" + text + "\" is not a list of layer ids or 0/1 flags (bad item \"" +
                  tok + "\")");
    items.push_back(v);
  }
  bool all01 =
      std::all_of(items.begin(), items.end(), [](long long x) { return x == 0 || x == 1; });
  if (int(items.size()) == num_layers && all01) {
    for (size_t i = 0; i < items.size(); ++i) flags[i] = int(items[i]);
    return flags;
  }
  for (long long v : items) {
    if (v >= num_layers)
      throw Error(what + ": layer " + std::to_string(v) + " does not exist (the model has " +
                  std::to_string(num_layers) + " layers)");
    flags[size_t(v)] = 1;
  }
  return flags;
}

ModelConfig tiny_model_config(const TinyModelOptions& o) {
  if (o.num_layers < 1)
    throw Error("num_layers = " + std::to_string(o.num_layers) + ", expected >= 1");
  std::vector<int> sparse = default_or(o.sparse_layers, o.num_layers, "sparse layers");
  std::vector<int> moe = default_or(o.moe_layers, o.num_layers, "MoE layers");
  bool any_sparse = std::any_of(sparse.begin(), sparse.end(), [](int x) { return x != 0; });
  bool any_moe = std::any_of(moe.begin(), moe.end(), [](int x) { return x != 0; });

  ModelConfig c;
  c.model_type = "minimax_m3_vl";
  c.architectures = {"MiniMaxM3SparseForConditionalGeneration"};
  c.hidden_size = o.hidden_size;
  c.num_hidden_layers = o.num_layers;
  c.num_attention_heads = o.num_heads;
  c.num_key_value_heads = o.num_kv_heads;
  c.head_dim = o.head_dim;
  c.vocab_size = o.vocab_size;
  c.max_position_embeddings = o.max_position;
  c.rms_norm_eps = o.rms_norm_eps;
  c.rope_theta = o.rope_theta;
  c.rotary_dim = o.rotary_dim;
  c.dense_intermediate_size = o.dense_intermediate;
  c.intermediate_size = o.expert_intermediate;
  c.shared_intermediate_size = o.shared_intermediate;
  c.n_shared_experts = o.shared_intermediate > 0 ? 1 : 0;
  c.num_local_experts = any_moe ? o.num_experts : 0;
  c.num_experts_per_tok = any_moe ? o.experts_per_tok : 0;
  c.routed_scaling_factor = o.routed_scaling_factor;
  c.moe_layer_freq = moe;
  c.bos_token_id = o.bos_token_id;
  c.eos_token_ids = o.eos_token_ids;
  c.use_sparse_attention = any_sparse;
  c.sparse_attention_freq = sparse;
  c.sparse_disable_index_value = sparse;
  c.sparse_num_index_heads = o.num_kv_heads;
  c.sparse_index_dim = o.index_dim;
  c.sparse_topk_blocks = o.topk_blocks;
  c.sparse_init_block = o.init_blocks;
  c.sparse_local_block = o.local_blocks;
  if (o.quant == "mxfp8" || o.quant == "fp8") {
    c.quant_method = o.quant;
    c.quant_block_rows = o.quant == "fp8" ? 128 : 1;
    c.quant_block_cols = o.quant == "fp8" ? 128 : 32;
    c.quant_ignored_layers = {"lm_head", "model.embed_tokens", "vision_tower"};
  } else if (!o.quant.empty()) {
    throw Error("quant = \"" + o.quant + "\", expected mxfp8, fp8 or none");
  }
  // Through the parser: the same validation (and messages) as loading the written config.
  return parse_model_config(model_config_to_json(c), "", "make-tiny-model options");
}

void write_tiny_model(const TinyModelOptions& o, const std::string& dir) {
  ModelConfig c = tiny_model_config(o);
  if (o.num_shards < 1)
    throw Error("num_shards = " + std::to_string(o.num_shards) + ", expected >= 1");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw Error("cannot create output directory " + dir + (ec ? " (" + ec.message() + ")" : ""));

  const int64_t H = c.hidden_size, D = c.head_dim;
  {
    // Everything is built in memory first; refuse sizes that are not "tiny" before allocating.
    double per_layer =
        double(H) * double(D) * (2.0 * c.num_attention_heads + 2.0 * c.num_key_value_heads) +
        double(H) * double(std::max<int64_t>(c.dense_intermediate_size, 0)) * 3.0 +
        double(H) * double(c.num_local_experts) * double(c.intermediate_size) * 3.0 +
        double(H) * double(c.shared_intermediate_size) * 3.0 +
        double(H) * double(c.sparse_index_dim) * (c.sparse_num_index_heads + 1.0);
    double total = per_layer * c.num_hidden_layers + 2.0 * double(c.vocab_size) * double(H);
    if (total > 4e9)
      throw Error("make-tiny-model: about " + std::to_string(int64_t(total / 1e6)) +
                  "M parameters is too large for a generated model (limit 4000M)");
  }
  const double ws = o.weight_scale;
  std::vector<TensorToWrite> ts;
  // A projection [rows, cols] ~ N(0, scale/sqrt(cols)): each output is O(1) when the input is.
  auto linear = [&](const std::string& name, int64_t rows, int64_t cols, bool quantize) {
    auto v = normal_values(o.seed, name, size_t(rows * cols), 0.0, ws / std::sqrt(double(cols)));
    std::string base = name.substr(0, name.size() - std::string(".weight").size());
    if (quantize && !c.quant_method.empty()) {
      // Quantize the BF16 weights, as published quantized checkpoints come from the BF16 ones.
      for (auto& x : v) x = round_bf16(x);
      if (c.quant_method == "mxfp8")
        add_mxfp8(ts, base, rows, cols, v);
      else
        add_block_fp8(ts, base, rows, cols, v);
    } else
      ts.push_back(to_tensor(name, DType::BF16, {rows, cols}, v));
  };
  // Gemma norms store raw w (the op computes x_hat * (1 + w)): small values around 0.
  auto norm = [&](const std::string& name, int64_t n) {
    ts.push_back(
        to_tensor(name, DType::BF16, {n}, normal_values(o.seed, name, size_t(n), 0.0, 0.1)));
  };

  const std::string M = "language_model.model.";
  ts.push_back(to_tensor(
      M + "embed_tokens.weight", DType::BF16, {c.vocab_size, H},
      normal_values(o.seed, M + "embed_tokens.weight", size_t(c.vocab_size * H), 0.0, 1.0)));
  norm(M + "norm.weight", H);
  // lm_head ~ N(0, 3/sqrt(H)): logits spread over several nats like a trained model's, so the
  // top tokens are separated by clear margins (stable greedy comparisons in tests).
  ts.push_back(
      to_tensor("language_model.lm_head.weight", DType::BF16, {c.vocab_size, H},
                normal_values(o.seed, "language_model.lm_head.weight", size_t(c.vocab_size * H),
                              0.0, 3.0 * ws / std::sqrt(double(H)))));

  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string L = M + "layers." + std::to_string(i) + ".";
    norm(L + "input_layernorm.weight", H);
    norm(L + "post_attention_layernorm.weight", H);
    const int64_t qd = int64_t(c.num_attention_heads) * D, kvd = int64_t(c.num_key_value_heads) * D;
    linear(L + "self_attn.q_proj.weight", qd, H, true);
    linear(L + "self_attn.k_proj.weight", kvd, H, true);
    linear(L + "self_attn.v_proj.weight", kvd, H, true);
    linear(L + "self_attn.o_proj.weight", H, qd, true);
    norm(L + "self_attn.q_norm.weight", D);
    norm(L + "self_attn.k_norm.weight", D);
    if (c.is_sparse_layer(i)) {
      const int64_t id = c.sparse_index_dim;
      linear(L + "self_attn.index_q_proj.weight", int64_t(c.sparse_num_index_heads) * id, H, true);
      linear(L + "self_attn.index_k_proj.weight", id, H, true);
      norm(L + "self_attn.index_q_norm.weight", id);
      norm(L + "self_attn.index_k_norm.weight", id);
    }
    if (c.is_moe_layer(i)) {
      const std::string B = L + "block_sparse_moe.";
      const int64_t E = c.num_local_experts, I = c.intermediate_size;
      ts.push_back(to_tensor(B + "gate.weight", DType::F32, {E, H},
                             normal_values(o.seed, B + "gate.weight", size_t(E * H), 0.0,
                                           1.0 / std::sqrt(double(H)))));
      ts.push_back(
          to_tensor(B + "e_score_correction_bias", DType::F32, {E},
                    normal_values(o.seed, B + "e_score_correction_bias", size_t(E), 0.0, 0.1)));
      for (int64_t e = 0; e < E; ++e) {
        const std::string X = B + "experts." + std::to_string(e) + ".";
        linear(X + "w1.weight", I, H, true);
        linear(X + "w3.weight", I, H, true);
        linear(X + "w2.weight", H, I, true);
      }
      if (c.shared_intermediate_size > 0) {
        const int64_t S = c.shared_intermediate_size;
        linear(B + "shared_experts.gate_proj.weight", S, H, true);
        linear(B + "shared_experts.up_proj.weight", S, H, true);
        linear(B + "shared_experts.down_proj.weight", H, S, true);
      }
    } else {
      const int64_t F = c.dense_intermediate_size;
      linear(L + "mlp.gate_proj.weight", F, H, true);
      linear(L + "mlp.up_proj.weight", F, H, true);
      linear(L + "mlp.down_proj.weight", H, F, true);
    }
  }

  // Remove what an earlier run may have left, so the directory holds exactly one layout.
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (e.path().extension() == ".safetensors" || n == "model.safetensors.index.json")
      std::filesystem::remove(e.path(), ec);
  }

  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (o.num_shards == 1) {
    write_safetensors(dir + "/model.safetensors", ts, meta);
  } else {
    // Round-robin by name order, so every shard gets a mix of dtypes.
    std::sort(ts.begin(), ts.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    int n = o.num_shards;
    std::vector<std::vector<TensorToWrite>> shards(static_cast<size_t>(n));
    for (size_t i = 0; i < ts.size(); ++i) shards[i % size_t(n)].push_back(std::move(ts[i]));
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    uint64_t total = 0;
    for (int s = 0; s < n; ++s) {
      char fname[64];
      std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n);
      for (const auto& t : shards[size_t(s)]) {
        index["weight_map"][t.name] = fname;
        total += t.bytes.size();
      }
      write_safetensors(dir + "/" + fname, shards[size_t(s)], meta);
    }
    index["metadata"]["total_size"] = total;
    write_text(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  }

  json cfg = model_config_to_json(c);
  write_text(dir + "/config.json", cfg.dump(2) + "\n");
  json gen = {{"do_sample", false}};
  if (c.bos_token_id >= 0) gen["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1)
    gen["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty())
    gen["eos_token_id"] = c.eos_token_ids;
  write_text(dir + "/generation_config.json", gen.dump(2) + "\n");
}

}  // namespace sieve
