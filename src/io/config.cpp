#include "io/config.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"

namespace sieve {

namespace {

using nlohmann::json;

// Keys that live inside text_config.sparse_attention_config in the published config. An override
// (or a plain text config) may give them flat at the text-config level; they are moved inside.
const std::set<std::string>& sparse_keys() {
  static const std::set<std::string> keys = {"use_sparse_attention", "sparse_attention_freq",
                                             "sparse_block_size",    "sparse_num_index_heads",
                                             "sparse_index_dim",     "sparse_topk_blocks",
                                             "sparse_init_block",    "sparse_local_block",
                                             "sparse_score_type",    "sparse_disable_index_value"};
  return keys;
}

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

std::string short_dump(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Typed reads from one JSON object; every error names the source file and the key.
class Reader {
 public:
  Reader(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const std::string& key) const {
    return obj_.is_object() && obj_.contains(key) && !obj_.at(key).is_null();
  }
  const json& at(const std::string& key) const { return obj_.at(key); }

  [[noreturn]] void fail(const std::string& key, const std::string& msg) const {
    throw Error(source_ + ": key \"" + prefix_ + key + "\" " + msg);
  }
  [[noreturn]] void wrong_type(const std::string& key, const std::string& expected) const {
    fail(key, "is " + type_name(at(key)) + " (" + short_dump(at(key)) + "), expected " + expected);
  }

  void require(const std::string& key) const {
    if (!has(key)) throw Error(source_ + ": required key \"" + prefix_ + key + "\" is missing");
  }

  int64_t get_int(const std::string& key, int64_t def) const {
    if (!has(key)) return def;
    const json& v = at(key);
    if (v.is_number_integer()) return v.get<int64_t>();
    // Some exporters write integral values as 4096.0.
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (d == double(int64_t(d)) && d > -9.2e18 && d < 9.2e18) return int64_t(d);
    }
    wrong_type(key, "an integer");
  }
  int get_int32(const std::string& key, int def) const {
    int64_t v = get_int(key, def);
    if (v < INT32_MIN || v > INT32_MAX) fail(key, "= " + std::to_string(v) + " is out of range");
    return int(v);
  }
  double get_double(const std::string& key, double def) const {
    if (!has(key)) return def;
    const json& v = at(key);
    if (!v.is_number()) wrong_type(key, "a number");
    return v.get<double>();
  }
  bool get_bool(const std::string& key, bool def) const {
    if (!has(key)) return def;
    const json& v = at(key);
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1))
      return v.get<int64_t>() == 1;
    wrong_type(key, "true or false");
  }
  std::string get_string(const std::string& key, const std::string& def) const {
    if (!has(key)) return def;
    const json& v = at(key);
    if (!v.is_string()) wrong_type(key, "a string");
    return v.get<std::string>();
  }
  // A per-layer 0/1 list. Also accepts bools inside the list.
  std::vector<int> get_int_list(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_array()) wrong_type(key, "a list of integers");
    std::vector<int> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const json& e = v[i];
      if (e.is_boolean()) {
        out.push_back(e.get<bool>() ? 1 : 0);
      } else if (e.is_number_integer()) {
        int64_t x = e.get<int64_t>();
        if (x < 0 || x > INT32_MAX)
          fail(key, "[" + std::to_string(i) + "] = " + std::to_string(x) + ", expected 0 or 1");
        out.push_back(int(x));
      } else {
        fail(key, "[" + std::to_string(i) + "] is " + type_name(e) + ", expected an integer");
      }
    }
    return out;
  }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

// RFC 7386-style merge without deletion: objects merge key by key, anything else replaces.
void merge_into(json& dst, const json& src) {
  for (auto it = src.begin(); it != src.end(); ++it) {
    if (it.value().is_object() && dst.contains(it.key()) && dst[it.key()].is_object()) {
      merge_into(dst[it.key()], it.value());
    } else {
      dst[it.key()] = it.value();
    }
  }
}

json parse_overrides(const std::string& text) {
  json ov;
  try {
    ov = json::parse(text);
  } catch (const json::exception& e) {
    throw Error("--hf-overrides: invalid JSON (" + std::string(e.what()) + ")");
  }
  if (!ov.is_object())
    throw Error("--hf-overrides: expected a JSON object such as {\"use_index_cache\": true}, got " +
                type_name(ov));
  return ov;
}

// Applies overrides to the text config: a nested "text_config" object merges into it too, and
// flat sparse keys land inside sparse_attention_config when the config has that object.
void apply_overrides(json& text, const json& ov) {
  for (auto it = ov.begin(); it != ov.end(); ++it) {
    const std::string& key = it.key();
    if (key == "text_config" && it.value().is_object()) {
      apply_overrides(text, it.value());
    } else if (sparse_keys().count(key) && text.contains("sparse_attention_config") &&
               text["sparse_attention_config"].is_object()) {
      text["sparse_attention_config"][key] = it.value();
    } else if (it.value().is_object() && text.contains(key) && text[key].is_object()) {
      merge_into(text[key], it.value());
    } else {
      text[key] = it.value();
    }
  }
}

// An override of num_hidden_layers alone (a few layers of a large model, to fit one GPU) keeps the
// first layers of the per-layer lists, so their kinds stay those of the published layout.
void truncate_layer_lists(json& text, const json& ov) {
  const json* flat = ov.contains("text_config") && ov["text_config"].is_object() ? &ov["text_config"] : &ov;
  if (!flat->contains("num_hidden_layers") || !(*flat)["num_hidden_layers"].is_number_integer()) return;
  const int64_t n = (*flat)["num_hidden_layers"].get<int64_t>();
  if (n < 1) return;
  for_each_layer_list(text, [&](json& obj, const char* key) {
    if (flat->contains(key) || !obj.contains(key) || !obj[key].is_array() || int64_t(obj[key].size()) <= n) return;
    json keep = json::array();
    for (int64_t i = 0; i < n; ++i) keep.push_back(obj[key][size_t(i)]);
    obj[key] = keep;
  });
}

// moe_layer_freq / sparse_attention_freq as an int k: layer i is on iff i >= first_k and
// i % k == 0 (the DeepSeek-V2/V3 convention for `moe_layer_freq` with `first_k_dense_replace`);
// k == 0 turns every layer off.
std::vector<int> layers_from_freq(int64_t k, int n, int first_k) {
  std::vector<int> out(size_t(std::max(n, 0)), 0);
  if (k <= 0) return out;
  for (int i = 0; i < n; ++i) out[size_t(i)] = (i >= first_k && i % k == 0) ? 1 : 0;
  return out;
}

}  // namespace

ModelConfig parse_model_config(const nlohmann::json& config, const std::string& hf_overrides,
                               const std::string& source) {
  if (!config.is_object())
    throw Error(source + ": expected a JSON object at the top level, got " + type_name(config));

  ModelConfig c;
  Reader top(config, source, "");
  c.model_type = top.get_string("model_type", "");
  if (top.has("architectures")) {
    const json& a = config.at("architectures");
    if (!a.is_array()) top.wrong_type("architectures", "a list of strings");
    for (const auto& e : a)
      if (e.is_string()) c.architectures.push_back(e.get<std::string>());
  }

  // The VL wrapper keeps the LLM in text_config; a plain text config has its keys at the top.
  bool vl = config.contains("text_config");
  if (vl && !config.at("text_config").is_object()) top.wrong_type("text_config", "an object");
  json text = vl ? config.at("text_config") : config;
  std::string prefix = vl ? "text_config." : "";
  if (!hf_overrides.empty()) {
    const json ov = parse_overrides(hf_overrides);
    apply_overrides(text, ov);
    truncate_layer_lists(text, ov);
  }
  c.raw = text;

  Reader t(text, source, prefix);
  for (const char* k : {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"})
    t.require(k);
  c.hidden_size = t.get_int("hidden_size", 0);
  c.num_hidden_layers = t.get_int32("num_hidden_layers", 0);
  c.num_attention_heads = t.get_int32("num_attention_heads", 0);
  // HF convention: absent num_key_value_heads means plain multi-head attention.
  c.num_key_value_heads = t.get_int32("num_key_value_heads", c.num_attention_heads);
  c.vocab_size = t.get_int("vocab_size", 0);
  if (c.hidden_size <= 0)
    t.fail("hidden_size", "= " + std::to_string(c.hidden_size) + ", expected > 0");
  // The bound keeps a corrupt value from turning into a multi-gigabyte per-layer table.
  if (c.num_hidden_layers <= 0 || c.num_hidden_layers > 100000)
    t.fail("num_hidden_layers",
           "= " + std::to_string(c.num_hidden_layers) + ", expected 1..100000");
  if (c.num_attention_heads <= 0)
    t.fail("num_attention_heads", "= " + std::to_string(c.num_attention_heads) + ", expected > 0");
  if (c.num_key_value_heads <= 0)
    t.fail("num_key_value_heads", "= " + std::to_string(c.num_key_value_heads) + ", expected > 0");
  if (c.vocab_size <= 0)
    t.fail("vocab_size", "= " + std::to_string(c.vocab_size) + ", expected > 0");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    t.fail("num_attention_heads", "= " + std::to_string(c.num_attention_heads) +
                                      " is not divisible by num_key_value_heads = " +
                                      std::to_string(c.num_key_value_heads));

  if (t.has("head_dim")) {
    c.head_dim = t.get_int32("head_dim", 0);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      t.fail("hidden_size",
             "= " + std::to_string(c.hidden_size) + " is not divisible by num_attention_heads = " +
                 std::to_string(c.num_attention_heads) + " (and head_dim is absent)");
    c.head_dim = int(c.hidden_size / c.num_attention_heads);
  }
  if (c.head_dim <= 0) t.fail("head_dim", "= " + std::to_string(c.head_dim) + ", expected > 0");

  c.max_position_embeddings = t.get_int("max_position_embeddings", 4096);
  if (c.max_position_embeddings <= 0)
    t.fail("max_position_embeddings",
           "= " + std::to_string(c.max_position_embeddings) + ", expected > 0");
  c.rms_norm_eps = float(t.get_double("rms_norm_eps", 1e-6));
  if (!(c.rms_norm_eps >= 0.0f)) t.fail("rms_norm_eps", "must be >= 0");
  c.use_gemma_norm = t.get_bool("use_gemma_norm", true);
  c.use_qk_norm = t.get_bool("use_qk_norm", true);
  c.qk_norm_type = t.get_string("qk_norm_type", "per_head");
  if (c.use_qk_norm && c.qk_norm_type != "per_head")
    t.fail("qk_norm_type", "= \"" + c.qk_norm_type + "\", expected \"per_head\"");
  c.attention_output_gate = t.get_bool("attention_output_gate", false);
  if (c.attention_output_gate)
    t.fail("attention_output_gate", "= true is not supported (MiniMax-M3 has false)");
  c.rope_theta = t.get_double("rope_theta", 10000.0);
  if (!(c.rope_theta > 0)) t.fail("rope_theta", "must be > 0");
  if (t.has("rope_scaling")) {
    const json& rs = text.at("rope_scaling");
    std::string type;
    if (rs.is_object()) {
      Reader r(rs, source, prefix + "rope_scaling.");
      type = r.has("rope_type") ? r.get_string("rope_type", "") : r.get_string("type", "");
    }
    if (!rs.is_object() || (type != "default" && !type.empty()))
      t.fail("rope_scaling", "= " + short_dump(rs) + " is not supported (expected plain RoPE)");
  }
  if (t.has("rotary_dim")) {
    c.rotary_dim = t.get_int32("rotary_dim", 0);
  } else if (t.has("partial_rotary_factor")) {
    double f = t.get_double("partial_rotary_factor", 1.0);
    double r = f * c.head_dim;
    if (r != double(int64_t(r)))
      t.fail("partial_rotary_factor", "= " + std::to_string(f) + " times head_dim " +
                                          std::to_string(c.head_dim) + " is not an integer");
    c.rotary_dim = int(r);
  } else {
    c.rotary_dim = c.head_dim;
  }
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim)
    t.fail(t.has("rotary_dim") ? "rotary_dim" : "partial_rotary_factor",
           "gives rotary_dim = " + std::to_string(c.rotary_dim) +
               ", expected an even number in [2, head_dim = " + std::to_string(c.head_dim) + "]");

  c.hidden_act = t.get_string("hidden_act", "swigluoai");
  if (c.hidden_act != "swigluoai")
    t.fail("hidden_act", "= \"" + c.hidden_act + "\" is not supported (expected \"swigluoai\")");
  c.swiglu_alpha = float(t.get_double("swiglu_alpha", 1.702));
  c.swiglu_limit = float(t.get_double("swiglu_limit", 7.0));
  c.swiglu_beta = float(t.get_double("swiglu_beta", 1.0));

  // MoE
  c.num_local_experts = t.get_int32("num_local_experts", 0);
  c.num_experts_per_tok = t.get_int32("num_experts_per_tok", 0);
  c.n_shared_experts = t.get_int32("n_shared_experts", 0);
  c.intermediate_size = t.get_int("intermediate_size", 0);
  c.dense_intermediate_size = t.get_int("dense_intermediate_size", c.intermediate_size);
  c.shared_intermediate_size =
      t.get_int("shared_intermediate_size", c.intermediate_size * c.n_shared_experts);
  c.scoring_func = t.get_string("scoring_func", "sigmoid");
  c.use_routing_bias = t.get_bool("use_routing_bias", true);
  c.routed_scaling_factor = float(t.get_double("routed_scaling_factor", 1.0));
  c.norm_topk_prob = t.get_bool("norm_topk_prob", true);
  int n = c.num_hidden_layers;
  if (t.has("moe_layer_freq")) {
    const json& v = text.at("moe_layer_freq");
    if (v.is_array()) {
      c.moe_layer_freq = t.get_int_list("moe_layer_freq");
    } else if (v.is_number_integer()) {
      int64_t k = t.get_int("moe_layer_freq", 1);
      if (k < 0) t.fail("moe_layer_freq", "= " + std::to_string(k) + ", expected >= 0");
      c.moe_layer_freq = layers_from_freq(k, n, t.get_int32("first_k_dense_replace", 0));
    } else {
      t.wrong_type("moe_layer_freq", "a per-layer list or an integer");
    }
  } else {
    // No per-layer map: every layer is MoE when the model has experts.
    c.moe_layer_freq.assign(size_t(n), c.num_local_experts > 0 ? 1 : 0);
  }
  if (int(c.moe_layer_freq.size()) != n)
    t.fail("moe_layer_freq", "has " + std::to_string(c.moe_layer_freq.size()) +
                                 " entries, expected num_hidden_layers = " + std::to_string(n));
  bool any_moe = false, any_dense = false;
  for (int i = 0; i < n; ++i) (c.moe_layer_freq[size_t(i)] != 0 ? any_moe : any_dense) = true;
  if (c.num_local_experts <= 0) any_dense = true, any_moe = false;
  if (c.num_local_experts < 0)
    t.fail("num_local_experts", "= " + std::to_string(c.num_local_experts) + ", expected >= 0");
  if (any_moe) {
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_local_experts)
      t.fail("num_experts_per_tok", "= " + std::to_string(c.num_experts_per_tok) +
                                        ", expected 1.." + std::to_string(c.num_local_experts) +
                                        " (num_local_experts)");
    if (c.intermediate_size <= 0)
      t.fail("intermediate_size",
             "= " + std::to_string(c.intermediate_size) + ", expected > 0 for MoE layers");
    if (c.shared_intermediate_size < 0)
      t.fail("shared_intermediate_size",
             "= " + std::to_string(c.shared_intermediate_size) + ", expected >= 0");
    if (c.scoring_func != "sigmoid")
      t.fail("scoring_func",
             "= \"" + c.scoring_func + "\" is not supported (expected \"sigmoid\")");
  }
  if (any_dense && c.dense_intermediate_size <= 0)
    t.fail("dense_intermediate_size", "= " + std::to_string(c.dense_intermediate_size) +
                                          ", expected > 0 for dense-MLP layers");

  c.tie_word_embeddings = t.has("tie_word_embeddings") ? t.get_bool("tie_word_embeddings", false)
                                                       : top.get_bool("tie_word_embeddings", false);
  // Token ids may sit in the text config or the wrapper; the text config wins.
  const Reader& ids = t.has("eos_token_id") || t.has("bos_token_id") ? t : top;
  c.bos_token_id = ids.get_int("bos_token_id", -1);
  if (ids.has("eos_token_id")) {
    const json& e = ids.at("eos_token_id");
    if (e.is_number_integer()) {
      c.eos_token_ids.push_back(e.get<int64_t>());
    } else if (e.is_array()) {
      for (const auto& x : e) {
        if (!x.is_number_integer())
          ids.wrong_type("eos_token_id", "an integer or a list of integers");
        c.eos_token_ids.push_back(x.get<int64_t>());
      }
    } else {
      ids.wrong_type("eos_token_id", "an integer or a list of integers");
    }
  }
  // transformers >= 5 writes "dtype"; older exports "torch_dtype".
  if (t.has("torch_dtype"))
    c.torch_dtype = t.get_string("torch_dtype", "bfloat16");
  else if (t.has("dtype"))
    c.torch_dtype = t.get_string("dtype", "bfloat16");
  else if (top.has("torch_dtype"))
    c.torch_dtype = top.get_string("torch_dtype", "bfloat16");

  // sparse_attention_config: nested in the published config; flat keys are accepted for plain
  // text configs.
  bool nested = t.has("sparse_attention_config");
  if (nested && !text.at("sparse_attention_config").is_object())
    t.wrong_type("sparse_attention_config", "an object");
  const json& sobj = nested ? text.at("sparse_attention_config") : text;
  Reader s(sobj, source, nested ? prefix + "sparse_attention_config." : prefix);
  c.use_sparse_attention = s.get_bool("use_sparse_attention", false);
  c.sparse_block_size = s.get_int32("sparse_block_size", 128);
  c.sparse_num_index_heads = s.get_int32("sparse_num_index_heads", c.num_key_value_heads);
  c.sparse_index_dim = s.get_int32("sparse_index_dim", c.head_dim);
  c.sparse_topk_blocks = s.get_int32("sparse_topk_blocks", 16);
  c.sparse_init_block = s.get_int32("sparse_init_block", 0);
  c.sparse_local_block = s.get_int32("sparse_local_block", 1);
  c.sparse_score_type = s.get_string("sparse_score_type", "max");
  if (s.has("sparse_attention_freq")) {
    const json& v = sobj.at("sparse_attention_freq");
    if (v.is_number_integer())
      c.sparse_attention_freq = layers_from_freq(v.get<int64_t>(), n, 0);
    else
      c.sparse_attention_freq = s.get_int_list("sparse_attention_freq");
  } else {
    c.sparse_attention_freq.assign(size_t(n), c.use_sparse_attention ? 1 : 0);
  }
  if (s.has("sparse_disable_index_value"))
    c.sparse_disable_index_value = s.get_int_list("sparse_disable_index_value");
  else
    c.sparse_disable_index_value.assign(size_t(n), 1);

  if (c.use_sparse_attention) {
    if (int(c.sparse_attention_freq.size()) != n)
      s.fail("sparse_attention_freq",
             "has " + std::to_string(c.sparse_attention_freq.size()) +
                 " entries, expected num_hidden_layers = " + std::to_string(n));
    if (int(c.sparse_disable_index_value.size()) != n)
      s.fail("sparse_disable_index_value",
             "has " + std::to_string(c.sparse_disable_index_value.size()) +
                 " entries, expected num_hidden_layers = " + std::to_string(n));
    if (c.sparse_block_size != 128)
      s.fail("sparse_block_size", "= " + std::to_string(c.sparse_block_size) +
                                      ": block size 128 is required for sparse models");
    if (c.sparse_score_type != "max")
      s.fail("sparse_score_type", "= \"" + c.sparse_score_type + "\": only \"max\" is supported");
    if (c.sparse_num_index_heads != c.num_key_value_heads)
      s.fail("sparse_num_index_heads",
             "= " + std::to_string(c.sparse_num_index_heads) + ", expected num_key_value_heads = " +
                 std::to_string(c.num_key_value_heads) + " (one index head per kv head)");
    if (c.sparse_index_dim <= 0 || c.sparse_index_dim % 2 != 0 || c.sparse_index_dim < c.rotary_dim)
      s.fail("sparse_index_dim",
             "= " + std::to_string(c.sparse_index_dim) +
                 ", expected an even number >= rotary_dim = " + std::to_string(c.rotary_dim) +
                 " (the indexer shares the main RoPE)");
    if (c.sparse_topk_blocks < 1)
      s.fail("sparse_topk_blocks", "= " + std::to_string(c.sparse_topk_blocks) + ", expected >= 1");
    if (c.sparse_init_block < 0)
      s.fail("sparse_init_block", "= " + std::to_string(c.sparse_init_block) + ", expected >= 0");
    if (c.sparse_local_block < 0)
      s.fail("sparse_local_block", "= " + std::to_string(c.sparse_local_block) + ", expected >= 0");
    for (int i = 0; i < n; ++i)
      if (c.sparse_attention_freq[size_t(i)] != 0 && c.sparse_disable_index_value[size_t(i)] == 0)
        s.fail("sparse_disable_index_value",
               "[" + std::to_string(i) +
                   "] = 0 (an index value path) is not supported; M3 has 1 on every sparse layer");
  } else {
    // Dense models still page the KV cache in blocks of 128.
    c.sparse_block_size = 128;
  }

  // Index top-k sharing: inference-time keys, normally from --hf-overrides (spec §3.4).
  c.use_index_cache = t.get_bool("use_index_cache", false);
  c.index_topk_freq = t.get_int32("index_topk_freq", 1);
  c.index_topk_pattern = t.get_string("index_topk_pattern", "");
  c.index_skip_topk_offset = t.get_int32("index_skip_topk_offset", 0);
  if (c.index_topk_freq < 1)
    t.fail("index_topk_freq", "= " + std::to_string(c.index_topk_freq) + ", expected >= 1");
  if (c.index_skip_topk_offset < 0)
    t.fail("index_skip_topk_offset",
           "= " + std::to_string(c.index_skip_topk_offset) + ", expected >= 0");
  for (size_t i = 0; i < c.index_topk_pattern.size(); ++i)
    if (c.index_topk_pattern[i] != 'F' && c.index_topk_pattern[i] != 'S')
      t.fail("index_topk_pattern", "= \"" + c.index_topk_pattern + "\" has '" +
                                       std::string(1, c.index_topk_pattern[i]) + "' at " +
                                       std::to_string(i) + ", expected only 'F' and 'S'");
  if (!c.index_topk_pattern.empty() && c.index_topk_pattern[0] == 'S')
    t.fail("index_topk_pattern", "= \"" + c.index_topk_pattern +
                                     "\" starts with 'S', but the first sparse layer has no "
                                     "earlier Full layer to share with (expected 'F')");

  // quantization_config sits at the top of the wrapper in published checkpoints.
  const json* q = nullptr;
  std::string qprefix;
  if (top.has("quantization_config"))
    q = &config.at("quantization_config"), qprefix = "";
  else if (t.has("quantization_config"))
    q = &text.at("quantization_config"), qprefix = prefix;
  if (q) {
    if (!q->is_object()) (qprefix.empty() ? top : t).wrong_type("quantization_config", "an object");
    Reader qr(*q, source, qprefix + "quantization_config.");
    c.quant_method = qr.get_string("quant_method", "");
    const json want_block = c.quant_method == "mxfp8" ? json::array({1, 32}) : json::array({128, 128});
    if (c.quant_method != "mxfp8" && c.quant_method != "fp8")
      qr.fail("quant_method", "= \"" + c.quant_method +
                                  "\" is not supported (expected \"mxfp8\" or \"fp8\" with "
                                  "weight_block_size [128, 128], or no quantization_config for bf16 checkpoints)");
    if (qr.has("weight_block_size")) {
      const json& b = q->at("weight_block_size");
      if (b != want_block)
        qr.fail("weight_block_size", "= " + short_dump(b) + ", expected " + want_block.dump(-1) + " for " +
                                         c.quant_method);
    } else if (c.quant_method == "fp8") {
      qr.fail("weight_block_size", "is missing: fp8 checkpoints are read with block scales [128, 128] "
                                   "(per-tensor fp8 scales are not supported)");
    }
    c.quant_block_rows = want_block[0].get<int>();
    c.quant_block_cols = want_block[1].get<int>();
    for (const char* key : {"ignored_layers", "modules_to_not_convert"}) {
      if (!qr.has(key) || q->at(key).is_null()) continue;
      const json& il = q->at(key);
      if (!il.is_array()) qr.wrong_type(key, "a list of strings");
      for (const auto& e : il) {
        if (!e.is_string()) qr.wrong_type(key, "a list of strings");
        c.quant_ignored_layers.push_back(e.get<std::string>());
      }
    }
  }
  return c;
}

ModelConfig load_model_config(const std::string& dir, const std::string& hf_overrides) {
  std::string path = dir + "/config.json";
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open (is " + dir + " a model directory?)");
  std::stringstream ss;
  ss << f.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    throw Error(path + ": invalid JSON (" + std::string(e.what()) + ")");
  }
  ModelConfig c = parse_model_config(j, hf_overrides, path);

  // generation_config.json is where HF generation takes its stop ids from; its eos ids join the
  // config's (a chat model often lists its end-of-turn token only there).
  std::string gen_path = dir + "/generation_config.json";
  std::ifstream g(gen_path, std::ios::binary);
  if (g) {
    std::stringstream gs;
    gs << g.rdbuf();
    json gj;
    try {
      gj = json::parse(gs.str());
    } catch (const json::exception& e) {
      throw Error(gen_path + ": invalid JSON (" + std::string(e.what()) + ")");
    }
    if (!gj.is_object()) throw Error(gen_path + ": expected a JSON object, got " + type_name(gj));
    Reader gr(gj, gen_path, "");
    if (c.bos_token_id < 0) c.bos_token_id = gr.get_int("bos_token_id", -1);
    if (gr.has("eos_token_id")) {
      const json& e = gj.at("eos_token_id");
      std::vector<int64_t> ids;
      if (e.is_number_integer())
        ids.push_back(e.get<int64_t>());
      else if (e.is_array())
        for (const auto& x : e) {
          if (!x.is_number_integer())
            gr.wrong_type("eos_token_id", "an integer or a list of integers");
          ids.push_back(x.get<int64_t>());
        }
      else
        gr.wrong_type("eos_token_id", "an integer or a list of integers");
      for (int64_t id : ids)
        if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
          c.eos_token_ids.push_back(id);
    }
  }
  return c;
}

nlohmann::json model_config_to_json(const ModelConfig& c) {
  json sparse = {
      {"use_sparse_attention", c.use_sparse_attention},
      {"sparse_attention_freq", c.sparse_attention_freq},
      {"sparse_block_size", c.sparse_block_size},
      {"sparse_num_index_heads", c.sparse_num_index_heads},
      {"sparse_index_dim", c.sparse_index_dim},
      {"sparse_topk_blocks", c.sparse_topk_blocks},
      {"sparse_init_block", c.sparse_init_block},
      {"sparse_local_block", c.sparse_local_block},
      {"sparse_score_type", c.sparse_score_type},
      {"sparse_disable_index_value", c.sparse_disable_index_value},
  };
  json text = {
      {"architectures", {"MiniMaxM3SparseForCausalLM"}},
      {"model_type", "minimax_m3"},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"use_gemma_norm", c.use_gemma_norm},
      {"use_qk_norm", c.use_qk_norm},
      {"qk_norm_type", c.qk_norm_type},
      {"attention_output_gate", c.attention_output_gate},
      {"rope_theta", c.rope_theta},
      {"rotary_dim", c.rotary_dim},
      {"partial_rotary_factor", double(c.rotary_dim) / double(c.head_dim)},
      {"hidden_act", c.hidden_act},
      {"swiglu_alpha", c.swiglu_alpha},
      {"swiglu_limit", c.swiglu_limit},
      {"dense_intermediate_size", c.dense_intermediate_size},
      {"intermediate_size", c.intermediate_size},
      {"shared_intermediate_size", c.shared_intermediate_size},
      {"num_local_experts", c.num_local_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"n_shared_experts", c.n_shared_experts},
      {"scoring_func", c.scoring_func},
      {"use_routing_bias", c.use_routing_bias},
      {"routed_scaling_factor", c.routed_scaling_factor},
      {"norm_topk_prob", c.norm_topk_prob},
      {"moe_layer_freq", c.moe_layer_freq},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", c.torch_dtype},
      {"sparse_attention_config", sparse},
  };
  // swiglu_beta is not in the published config; write it only when it differs from the default.
  if (c.swiglu_beta != 1.0f) text["swiglu_beta"] = c.swiglu_beta;
  if (c.bos_token_id >= 0) text["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1)
    text["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty())
    text["eos_token_id"] = c.eos_token_ids;
  // Index sharing is not part of the published config: written only when in use.
  if (c.use_index_cache) {
    text["use_index_cache"] = true;
    text["index_topk_freq"] = c.index_topk_freq;
    if (!c.index_topk_pattern.empty()) text["index_topk_pattern"] = c.index_topk_pattern;
    text["index_skip_topk_offset"] = c.index_skip_topk_offset;
  }
  json out = {
      {"architectures", {"MiniMaxM3SparseForConditionalGeneration"}},
      {"model_type", "minimax_m3_vl"},
      {"torch_dtype", c.torch_dtype},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"text_config", text},
  };
  if (!c.quant_method.empty()) {
    json q = {{"quant_method", c.quant_method},
              {"activation_scheme", "dynamic"},
              {"weight_block_size", {c.quant_block_rows, c.quant_block_cols}},
              {"ignored_layers", c.quant_ignored_layers}};
    out["quantization_config"] = q;
  }
  return out;
}

bool ModelConfig::is_sparse_layer(int layer) const {
  return use_sparse_attention && layer >= 0 && layer < int(sparse_attention_freq.size()) &&
         sparse_attention_freq[size_t(layer)] != 0;
}

bool ModelConfig::is_moe_layer(int layer) const {
  return num_local_experts > 0 && layer >= 0 && layer < int(moe_layer_freq.size()) &&
         moe_layer_freq[size_t(layer)] != 0;
}

int ModelConfig::sparse_ordinal(int layer) const {
  if (!is_sparse_layer(layer)) return -1;
  int o = 0;
  for (int i = 0; i < layer; ++i) o += is_sparse_layer(i) ? 1 : 0;
  return o;
}

bool ModelConfig::shares_index_topk(int layer) const {
  int o = sparse_ordinal(layer);
  if (o < 0 || !use_index_cache) return false;
  if (!index_topk_pattern.empty())
    return o < int(index_topk_pattern.size()) && index_topk_pattern[size_t(o)] == 'S';
  if (index_topk_freq <= 1) return false;
  return std::max(o - index_skip_topk_offset, 0) % index_topk_freq != 0;
}

void for_each_layer_list(json& text, const std::function<void(json& holder, const char* key)>& fn) {
  fn(text, "moe_layer_freq");
  json& sparse = text.contains("sparse_attention_config") && text["sparse_attention_config"].is_object()
                     ? text["sparse_attention_config"]
                     : text;
  fn(sparse, "sparse_attention_freq");
  fn(sparse, "sparse_disable_index_value");
}

}  // namespace sieve
