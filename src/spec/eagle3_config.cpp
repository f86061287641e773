// EAGLE3 draft config.json: reading, checking against the target, and random drafts.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "spec/eagle3.h"

namespace sieve::spec {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<int> default_aux_layers(int n) {
  return {2, n / 2, n - 3};
}

namespace {

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw Error("speculative draft " + file + ": " + what);
}

int64_t need_int(const json& j, const std::string& file, const char* key) {
  if (!j.contains(key) || !j[key].is_number_integer())
    bad(file, std::string("\"") + key + "\" (an integer) is missing");
  return j[key].get<int64_t>();
}

}  // namespace

Eagle3Config load_eagle3_config(const std::string& dir, const ModelConfig& target) {
  const std::string file = (fs::path(dir) / "config.json").string();
  std::ifstream in(file);
  if (!in)
    throw Error("speculative draft: cannot read " + file + " (is \"model\" a draft directory?)");
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    bad(file, std::string("not valid JSON (") + e.what() + ")");
  }
  Eagle3Config c;
  c.hidden_size = need_int(j, file, "hidden_size");
  c.intermediate_size = need_int(j, file, "intermediate_size");
  c.num_heads = int(need_int(j, file, "num_attention_heads"));
  c.num_kv_heads = j.contains("num_key_value_heads") ? int(need_int(j, file, "num_key_value_heads"))
                                                     : c.num_heads;
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null()
                   ? int(need_int(j, file, "head_dim"))
                   : int(c.hidden_size / std::max(c.num_heads, 1));
  c.vocab_size = need_int(j, file, "vocab_size");
  c.draft_vocab_size = j.contains("draft_vocab_size") && !j["draft_vocab_size"].is_null()
                           ? need_int(j, file, "draft_vocab_size")
                           : c.vocab_size;
  c.target_hidden_size = j.contains("target_hidden_size") && !j["target_hidden_size"].is_null()
                             ? need_int(j, file, "target_hidden_size")
                             : c.hidden_size;
  if (j.contains("rms_norm_eps")) c.rms_norm_eps = j["rms_norm_eps"].get<float>();
  if (j.contains("rope_theta")) c.rope_theta = j["rope_theta"].get<double>();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("rope_theta"))
    c.rope_theta = j["rope_parameters"]["rope_theta"].get<double>();
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    const std::string t = rs.value("rope_type", rs.value("type", std::string("default")));
    if (t != "default")
      bad(file, "rope_scaling type \"" + t + "\" is not supported (only default RoPE)");
  }
  c.norm_before_residual = j.value("norm_before_residual", false);
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    bad(file, "hidden_act " + j["hidden_act"].dump() + " is not supported (expected \"silu\")");
  if (j.contains("num_hidden_layers") && need_int(j, file, "num_hidden_layers") != 1)
    bad(file, "num_hidden_layers must be 1 (an EAGLE3 draft has one decoder layer)");
  const json* ids = nullptr;
  if (j.contains("eagle_aux_hidden_state_layer_ids")) ids = &j["eagle_aux_hidden_state_layer_ids"];
  if (j.contains("eagle_config") && j["eagle_config"].is_object()) {
    const json& e = j["eagle_config"];
    if (e.contains("eagle_aux_hidden_state_layer_ids"))
      ids = &e["eagle_aux_hidden_state_layer_ids"];
    if (e.contains("use_aux_hidden_state") && !e["use_aux_hidden_state"].get<bool>())
      bad(file, "eagle_config.use_aux_hidden_state false (EAGLE1/2 drafts) is not supported");
  }
  if (ids && !ids->is_null()) {
    if (!ids->is_array() || ids->empty())
      bad(file, "eagle_aux_hidden_state_layer_ids must be a non-empty list");
    for (const json& v : *ids) {
      if (!v.is_number_integer())
        bad(file, "eagle_aux_hidden_state_layer_ids must hold layer numbers");
      c.aux_layers.push_back(v.get<int>());
    }
  } else {
    c.aux_layers = default_aux_layers(target.num_hidden_layers);
  }

  // What must fit the target.
  if (c.vocab_size != target.vocab_size)
    bad(file, "vocab_size " + std::to_string(c.vocab_size) + " does not match the target's " +
                  std::to_string(target.vocab_size));
  if (c.draft_vocab_size < 1 || c.draft_vocab_size > c.vocab_size)
    bad(file, "draft_vocab_size " + std::to_string(c.draft_vocab_size) + " must be in 1.." +
                  std::to_string(c.vocab_size));
  if (c.target_hidden_size != target.hidden_size)
    bad(file, "target hidden size " + std::to_string(c.target_hidden_size) +
                  " (target_hidden_size, else hidden_size)"
                  " does not match the target's hidden_size " +
                  std::to_string(target.hidden_size));
  for (int l : c.aux_layers)
    if (l < 0 || l >= target.num_hidden_layers)
      bad(file, "aux hidden state layer " + std::to_string(l) +
                    " is not a layer of the target (0.." +
                    std::to_string(target.num_hidden_layers - 1) + ")");
  if (c.hidden_size < 1 || c.intermediate_size < 1 || c.num_heads < 1 || c.num_kv_heads < 1 ||
      c.num_heads % c.num_kv_heads != 0)
    bad(file,
        "hidden_size, intermediate_size and head counts must be positive, heads a multiple of kv "
        "heads");
  if (c.head_dim <= 0 || c.head_dim % 32 != 0 || c.head_dim > 256)
    bad(file, "head_dim " + std::to_string(c.head_dim) +
                  " is not supported (a multiple of 32 up to 256)");
  return c;
}

// ---------------------------------------------------------------------------------------------
// Random drafts

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

TensorToWrite random_bf16(Rng& r, const std::string& name, std::vector<int64_t> shape, double std,
                          double mean = 0) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  TensorToWrite t{name, DType::BF16, std::move(shape), std::vector<uint8_t>(size_t(n) * 2)};
  for (int64_t i = 0; i < n; ++i)
    store_from_f32(t.bytes.data(), DType::BF16, size_t(i), float(mean + std * r.normal()));
  return t;
}

}  // namespace

void write_random_eagle3(const std::string& dir, const ModelConfig& t,
                         const RandomEagle3Options& o) {
  const int64_t H = o.hidden_size ? o.hidden_size : t.hidden_size;
  const int64_t I = o.intermediate_size ? o.intermediate_size : 2 * H;
  const int64_t dv = o.draft_vocab_size ? o.draft_vocab_size : t.vocab_size;
  const std::vector<int> aux =
      o.aux_layers.empty() ? default_aux_layers(t.num_hidden_layers) : o.aux_layers;
  SIEVE_CHECK(dv <= t.vocab_size, "draft vocabulary larger than the target's");
  SIEVE_CHECK(o.own_embedding || H == t.hidden_size,
              "a draft without embeddings needs the target's hidden size");
  fs::create_directories(dir);
  json c;
  c["architectures"] = {"LlamaForCausalLMEagle3"};
  c["model_type"] = "llama";
  c["hidden_size"] = H;
  c["intermediate_size"] = I;
  c["num_attention_heads"] = o.num_heads;
  c["num_key_value_heads"] = o.num_kv_heads;
  c["head_dim"] = o.head_dim;
  c["num_hidden_layers"] = 1;
  c["hidden_act"] = "silu";
  c["rms_norm_eps"] = 1e-6;
  c["rope_theta"] = o.rope_theta;
  c["vocab_size"] = t.vocab_size;
  c["draft_vocab_size"] = dv;
  c["target_hidden_size"] = t.hidden_size;
  c["max_position_embeddings"] = t.max_position_embeddings;
  c["tie_word_embeddings"] = false;
  c["norm_before_residual"] = o.norm_before_residual;
  c["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", aux}, {"use_aux_hidden_state", true}};
  c["torch_dtype"] = "bfloat16";
  std::ofstream(fs::path(dir) / "config.json") << c.dump(2) << "\n";
  if (!o.write_weights) return;

  Rng r{o.seed * 0x9e3779b97f4a7c15ull + 0x5eed};
  const double s = o.weight_scale;
  const int64_t Ht = t.hidden_size, na = int64_t(aux.size()), hd = o.head_dim;
  std::vector<TensorToWrite> w;
  if (o.own_embedding) w.push_back(random_bf16(r, "embed_tokens.weight", {t.vocab_size, H}, 1.0));
  w.push_back(random_bf16(r, "fc.weight", {H, na * Ht}, s / std::sqrt(double(na * Ht))));
  const std::string L = "midlayer.";
  w.push_back(random_bf16(r, L + "self_attn.q_proj.weight", {o.num_heads * hd, 2 * H},
                          s / std::sqrt(2.0 * H)));
  w.push_back(random_bf16(r, L + "self_attn.k_proj.weight", {o.num_kv_heads * hd, 2 * H},
                          s / std::sqrt(2.0 * H)));
  w.push_back(random_bf16(r, L + "self_attn.v_proj.weight", {o.num_kv_heads * hd, 2 * H},
                          s / std::sqrt(2.0 * H)));
  w.push_back(random_bf16(r, L + "self_attn.o_proj.weight", {H, o.num_heads * hd},
                          s / std::sqrt(double(o.num_heads * hd))));
  w.push_back(random_bf16(r, L + "mlp.gate_proj.weight", {I, H}, s / std::sqrt(double(H))));
  w.push_back(random_bf16(r, L + "mlp.up_proj.weight", {I, H}, s / std::sqrt(double(H))));
  w.push_back(random_bf16(r, L + "mlp.down_proj.weight", {H, I}, s / std::sqrt(double(I))));
  for (const char* n : {"input_layernorm", "hidden_norm", "post_attention_layernorm"})
    w.push_back(random_bf16(r, L + n + ".weight", {H}, 0.1, 1.0));
  w.push_back(random_bf16(r, "norm.weight", {H}, 0.1, 1.0));
  w.push_back(random_bf16(r, "lm_head.weight", {dv, H}, 4.0 / std::sqrt(double(H))));
  // d2t: a sorted random subset of the target's ids (every id when the vocabularies are equal).
  std::vector<int64_t> ids(size_t(t.vocab_size));
  for (int64_t i = 0; i < t.vocab_size; ++i) ids[size_t(i)] = i;
  for (int64_t i = t.vocab_size - 1; i > 0 && dv < t.vocab_size; --i)
    std::swap(ids[size_t(i)], ids[size_t(r.next() % uint64_t(i + 1))]);
  ids.resize(size_t(dv));
  std::sort(ids.begin(), ids.end());
  TensorToWrite d2t{"d2t", DType::I64, {dv}, std::vector<uint8_t>(size_t(dv) * 8)};
  for (int64_t i = 0; i < dv; ++i) {
    const int64_t off = ids[size_t(i)] - i;
    std::memcpy(d2t.bytes.data() + i * 8, &off, 8);
  }
  w.push_back(std::move(d2t));
  TensorToWrite t2d{
      "t2d", DType::U8, {t.vocab_size}, std::vector<uint8_t>(size_t(t.vocab_size), 0)};
  for (int64_t id : ids) t2d.bytes[size_t(id)] = 1;
  w.push_back(std::move(t2d));
  write_safetensors((fs::path(dir) / "model.safetensors").string(), w);
}

}  // namespace sieve::spec
