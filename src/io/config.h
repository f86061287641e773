// Model configuration: the published MiniMax-M3 config.json (model_type "minimax_m3_vl" with the
// LLM in "text_config"), or a plain text config, with --hf-overrides merged on top.
// Every key of spec §1 is read; defaults are the code defaults of the published engines.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sieve {

struct ModelConfig {
  std::string model_type;  // as found at the top level ("minimax_m3_vl", or the text model's)
  std::vector<std::string> architectures;

  int64_t hidden_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  bool use_gemma_norm = true;
  bool use_qk_norm = true;
  std::string qk_norm_type = "per_head";
  bool attention_output_gate = false;
  double rope_theta = 10000.0;
  int rotary_dim = 0;  // from rotary_dim, else partial_rotary_factor * head_dim
  std::string hidden_act = "swigluoai";
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  float swiglu_beta = 1.0f;
  int64_t dense_intermediate_size = 0;   // dense MLP layers
  int64_t intermediate_size = 0;         // per routed expert
  int64_t shared_intermediate_size = 0;  // shared expert (0 = none)
  int num_local_experts = 0;
  int num_experts_per_tok = 0;
  int n_shared_experts = 0;
  std::string scoring_func = "sigmoid";
  bool use_routing_bias = true;
  float routed_scaling_factor = 1.0f;
  bool norm_topk_prob = true;
  // Per layer: 1 = MoE, 0 = dense MLP. The config may give a list, or an int k: layer i is MoE iff
  // i >= first_k_dense_replace and i % k == 0 (the DeepSeek-V2/V3 convention; 0 = no MoE);
  // absent = every layer MoE when num_local_experts > 0.
  std::vector<int> moe_layer_freq;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype = "bfloat16";

  // sparse_attention_config
  bool use_sparse_attention = false;
  std::vector<int> sparse_attention_freq;  // per layer: 1 = sparse (MSA), 0 = dense GQA
  int sparse_block_size = 128;
  int sparse_num_index_heads = 0;
  int sparse_index_dim = 0;
  int sparse_topk_blocks = 16;
  int sparse_init_block = 0;
  int sparse_local_block = 1;
  std::string sparse_score_type = "max";
  std::vector<int> sparse_disable_index_value;

  // Index top-k sharing across sparse layers (inference-time overrides, spec §3.4).
  bool use_index_cache = false;
  int index_topk_freq = 1;
  std::string index_topk_pattern;  // 'F'/'S' per sparse ordinal; empty = use the frequency
  int index_skip_topk_offset = 0;

  // quantization_config: quant_method "" (bf16 checkpoint), "mxfp8" (F8_E4M3 weights with an
  // E8M0 scale per 1 x 32 block, weight_block_size [1, 32]) or "fp8" (F8_E4M3 weights with a
  // float multiplier per weight_block_size block, [128, 128] as DeepSeek-V3 and Qwen3-FP8 ship
  // it). The scales are the `weight_scale_inv` tensors. ignored_layers (or
  // modules_to_not_convert) name the modules stored unquantized.
  std::string quant_method;
  int quant_block_rows = 0, quant_block_cols = 0;
  std::vector<std::string> quant_ignored_layers;

  nlohmann::json raw;  // the text config after overrides, for keys not modelled above

  bool is_sparse_layer(int layer) const;
  bool is_moe_layer(int layer) const;
  // Sparse ordinal of an absolute layer (0 for the first sparse layer); -1 for dense layers.
  int sparse_ordinal(int layer) const;
  // Whether a sparse layer reuses the top-k of the most recent full layer (spec §3.4).
  bool shares_index_topk(int layer) const;
};

// Loads DIR/config.json (throws Error naming the file and key on any problem), merges
// `hf_overrides` (a JSON object text; keys apply to the text config; "text_config" nested
// objects are merged too) and validates (block size 128 for sparse models, score type "max",
// index heads == kv heads, list lengths == num_hidden_layers, ...). DIR/generation_config.json,
// when present, adds its eos_token_id(s) to eos_token_ids (and bos_token_id when config.json has
// none).
ModelConfig load_model_config(const std::string& dir, const std::string& hf_overrides = "");
// Same, from JSON already in memory; `source` names it in errors.
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& hf_overrides = "",
                               const std::string& source = "config.json");

// The text config's per-layer lists: fn(the object that holds the key, the key) for
// moe_layer_freq (in `text`) and sparse_attention_freq and sparse_disable_index_value (in
// sparse_attention_config where the config has that object, else in `text`), present or not.
void for_each_layer_list(nlohmann::json& text, const std::function<void(nlohmann::json& holder, const char* key)>& fn);

// Writes the published VL layout: {"model_type": "minimax_m3_vl", "text_config": {...}, ...}.
nlohmann::json model_config_to_json(const ModelConfig& c);

}  // namespace sieve
