// EAGLE3 drafts (Li et al. 2025) in their published Hugging Face layout, as vLLM's and SGLang's
// llama_eagle3 read them: one Llama-style decoder layer whose attention input is
//   [input_layernorm(embed(token)) | hidden_norm(g)]   (2 H wide)
// where g = fc(concat of the target's aux hidden states) on the first draft pass over a
// position, and the draft's own pre-norm output at the position before on the next ones; then
// o_proj + g, post_attention_layernorm, a SiLU MLP, the final norm and an lm_head over a draft
// vocabulary mapped to target ids by d2t (target = draft id + d2t[draft id]).
//
// Tensors: fc.weight [H, n_aux * H_target]; midlayer.* or layers.0.* (self_attn.{q,k,v,o}_proj,
// mlp.{gate,up,down}_proj, input_layernorm, hidden_norm, post_attention_layernorm); norm.weight;
// lm_head.weight [draft_vocab, H]; d2t [draft_vocab] (I64 offsets); t2d (ignored); optionally
// embed_tokens.weight (absent: the target's embedding is used, as vLLM does). A leading
// "model." is accepted on every name.
//
// The draft runs through kernels/ops.h only, over a paged KV cache of its own that uses the
// target's block ids (a draft position lives where the target's does), so rollback and prefix
// reuse follow the target's block tables.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"
#include "kernels/memory.h"
#include "kernels/ops.h"

namespace sieve::spec {

struct Eagle3Config {
  int64_t hidden_size = 0, intermediate_size = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t vocab_size = 0, draft_vocab_size = 0;
  int64_t target_hidden_size = 0;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  std::vector<int> aux_layers;  // target layers whose input residual stream feeds fc
  bool norm_before_residual = false;
};

// Reads DIR/config.json and checks it against the target: hidden size (fc input = n_aux x the
// target's hidden), vocabulary, aux layer ids inside the target, head_dim 128 multiple of 32 ...
// Errors name the file and field. eagle_aux_hidden_state_layer_ids may sit at the top level or in
// eagle_config; absent: the target's (2, n / 2, n - 3) as vLLM picks them.
Eagle3Config load_eagle3_config(const std::string& dir, const ModelConfig& target);

// The aux layers vLLM and SGLang use when a draft names none: (2, n / 2, n - 3) (spec section 6).
std::vector<int> default_aux_layers(int num_target_layers);

// One pass of the draft over a step laid out as the target's (kernels/ops.h "Conventions").
struct DraftStep {
  ops::BatchView batch;
  const int32_t* token_ids = nullptr;     // [num_tokens] the token after each position
  const int32_t* positions = nullptr;     // [num_tokens]
  const int64_t* slot_mapping = nullptr;  // [num_tokens], < 0: write nothing (rejected rows)
  int max_position = 0;
  // g: fc over the target's aux hidden states (first pass over positions), or (aux null) the rows
  // hidden_rows of the previous pass's pre-norm output (prev_rows of them).
  const float* aux = nullptr;            // [n_aux, num_tokens, target_hidden]
  const int32_t* hidden_rows = nullptr;  // [num_tokens]
  int64_t prev_rows = 0;
  // Logits of rows logits_rows[0..num_logits) (on the device, so a captured pass can take other
  // rows each replay).
  const int32_t* logits_rows = nullptr;  // [num_logits]
  int64_t num_logits = 0;
  float* logits = nullptr;  // [num_logits, draft_vocab] on the device
};

class Eagle3Draft {
 public:
  // target_embed: the target's input embedding [vocab, hidden] on `device`, used when the draft
  // has no embed_tokens of its own (it must outlive the draft).
  // dummy: config.json only, weights made up (--load-format dummy benchmarks).
  static std::unique_ptr<Eagle3Draft> load(const std::string& dir, const ModelConfig& target,
                                           const Device& device,
                                           const ops::WeightView& target_embed, bool dummy = false);
  ~Eagle3Draft();

  const Eagle3Config& config() const { return cfg_; }
  const Device& device() const { return dev_; }
  // Draft id -> target id.
  const std::vector<int32_t>& draft_to_target() const { return d2t_; }
  size_t cache_bytes_per_block(DType kv_dtype, int block_size) const;

  // The draft's KV cache: num_blocks + 1 blocks (the last one for padding rows, as the
  // target's), positions up to max_positions.
  void allocate_cache(DType kv_dtype, int64_t num_blocks, int block_size, int64_t max_positions);
  void release_cache();
  // Bumped when a buffer a captured pass points at is replaced.
  uint64_t buffers_epoch() const { return epoch_; }
  void reserve(int64_t max_tokens, int64_t max_logit_rows);

  // Enqueues one pass on `stream`: writes the draft KV of the step's positions, its pre-norm
  // output rows (kept for the next pass) and the logits rows. Allocates nothing once grown.
  void forward(const DraftStep& step, const ops::Stream& stream);

  struct Impl;  // weights, cache and activations (eagle3.cpp)

 private:
  Eagle3Draft() = default;
  Eagle3Config cfg_;
  Device dev_;
  std::vector<int32_t> d2t_;
  std::unique_ptr<Impl> impl_;
  uint64_t epoch_ = 0;
};

// Random-weight drafts in the published layout, for tests and benchmarks.
struct RandomEagle3Options {
  uint64_t seed = 0;
  int64_t hidden_size = 0;        // 0: the target's
  int64_t intermediate_size = 0;  // 0: 2 x hidden
  int num_heads = 2, num_kv_heads = 1, head_dim = 128;
  int64_t draft_vocab_size = 0;  // 0: the target's vocabulary (d2t all zero)
  std::vector<int> aux_layers;   // empty: default_aux_layers
  bool own_embedding = true;
  bool norm_before_residual = false;
  double rope_theta = 10000.0;
  float weight_scale = 1.0f;
  bool write_weights = true;  // false: config.json only (a checkpoint for --load-format dummy)
};
void write_random_eagle3(const std::string& dir, const ModelConfig& target,
                         const RandomEagle3Options& o);

}  // namespace sieve::spec
