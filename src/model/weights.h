// MiniMax-M3 weights as the forward pass uses them: projections fused per layer
// ([q | k | v | index_q | index_k] and [gate | up]), kept in the checkpoint's dtype (BF16 or F32;
// MXFP8 weights are dequantized to BF16 at load, which is exact), norms in F32.
#pragma once

#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "kernels/memory.h"

namespace sieve::model {

// A weight matrix [rows, cols] on the model's device.
struct Weight {
  Buffer buf;
  DType dtype = DType::BF16;
  int64_t rows = 0, cols = 0;
  const void* data() const { return buf.data(); }
};

struct LayerWeights {
  bool sparse = false;
  bool moe = false;
  Weight input_norm, post_norm;  // F32 [hidden]
  Weight qkv;                    // [q | k | v | index_q | index_k] rows x hidden
  Weight o_proj;                 // [hidden, heads * head_dim]
  Weight q_norm, k_norm, index_q_norm, index_k_norm;  // F32 [head_dim] / [index_dim]
  // Dense MLP
  Weight mlp_gate_up;  // [2 * dense_inter, hidden]
  Weight mlp_down;     // [hidden, dense_inter]
  // MoE
  Weight router;       // F32 [experts, hidden]
  Weight router_bias;  // F32 [experts] (empty when use_routing_bias is false)
  std::vector<Weight> expert_gate_up;  // each [2 * inter, hidden]
  std::vector<Weight> expert_down;     // each [hidden, inter]
  Buffer expert_gate_up_ptrs, expert_down_ptrs;  // device arrays of the pointers above
  Weight shared_gate_up;  // [2 * shared_inter, hidden] (empty when no shared expert)
  Weight shared_down;     // [hidden, shared_inter]
};

struct ModelWeights {
  Weight embed;    // [vocab, hidden]
  Weight norm;     // F32 [hidden]
  Weight lm_head;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
};

// Reads every tensor the config calls for, under the prefixes `language_model.model.`,
// `model.language_model.` or `model.` (vision tensors are ignored). A missing or mis-shaped
// tensor is an Error naming it and the shape expected.
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const Device& device);

}  // namespace sieve::model
