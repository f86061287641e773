// Random-weight MiniMax-M3 checkpoints in the published layout (VL config.json with text_config,
// `language_model.*` tensor names, BF16 weights, F32 router), for tests and demos. Weights are
// drawn per tensor from a stream seeded by (seed, tensor name), so a checkpoint is a pure
// function of its options on every platform.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"

namespace sieve {

struct TinyModelOptions {
  uint64_t seed = 0;
  int num_layers = 4;
  // Per-layer 0/1 flags; empty = the default layout: layer 0 dense attention + dense MLP, every
  // other layer sparse attention + MoE (M3's layout in miniature).
  std::vector<int> sparse_layers;
  std::vector<int> moe_layers;
  int64_t hidden_size = 128;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 64;
  int rotary_dim = 32;
  int64_t vocab_size = 512;
  int num_experts = 8;
  int experts_per_tok = 2;
  int64_t expert_intermediate = 64;
  int64_t shared_intermediate = 64;  // 0 = no shared expert
  int64_t dense_intermediate = 256;
  int index_dim = 64;
  int topk_blocks = 2;
  int init_blocks = 0;
  int local_blocks = 1;
  int64_t max_position = 8192;
  double rope_theta = 10000.0;
  float routed_scaling_factor = 2.0f;
  float rms_norm_eps = 1e-6f;
  // Multiplies the standard deviation of every projection (1.0 keeps activations O(1)).
  float weight_scale = 1.0f;
  // Projections as "" (BF16), "mxfp8" (fp8 e4m3 with an E8M0 `weight_scale_inv` per 1x32 block
  // along K, like MiniMaxAI/MiniMax-M3-MXFP8) or "fp8" (fp8 e4m3 with an F32 `weight_scale_inv`
  // per 128x128 block, the Hugging Face fp8 layout of DeepSeek-V3 and Qwen3-FP8), with the
  // matching quantization_config. Both are quantized from the BF16 weights of the same options.
  std::string quant;
  int num_shards = 1;  // > 1: model-0000i-of-0000n.safetensors + model.safetensors.index.json
  int64_t bos_token_id = -1;  // -1: not written
  std::vector<int64_t> eos_token_ids;
};

// The config the options describe (validated: throws Error naming the option's config key).
ModelConfig tiny_model_config(const TinyModelOptions& opts);

// Writes config.json, generation_config.json and the safetensors file(s) into `dir` (created if
// needed). Throws Error on invalid options or an unwritable directory.
void write_tiny_model(const TinyModelOptions& opts, const std::string& dir);

// Parses a layer list as the command line gives it: "1,2,3" (layer ids), a 0/1 flag per layer
// ("0,1,1,1", when it has exactly num_layers entries of 0 and 1), "all" or "none"/"".
std::vector<int> parse_layer_list(const std::string& text, int num_layers, const std::string& what);

}  // namespace sieve
