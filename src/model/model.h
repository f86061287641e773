// The MiniMax-M3 text model: weights by the published tensor names, paged KV + index caches, and
// the forward pass of one engine step (prefill chunks and decodes mixed), written against
// kernels/ops.h only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/config.h"

namespace sieve::model {

// Cache dtype names as users give them: auto (the model dtype, bf16), bf16, fp8, fp32.
DType parse_cache_dtype(const std::string& name, const std::string& flag);

struct LoadOptions {
  std::string hf_overrides;  // JSON object text merged over the text config
  Device device;             // CPU (the reference backend) or CUDA
  // CUDA: decode steps (one new token per sequence) of up to max_graph_batch sequences run as
  // CUDA graphs, captured on first use per (padded batch, context bucket); enforce_eager
  // launches every kernel of every step instead (vLLM's --enforce-eager).
  bool enforce_eager = false;
  int max_graph_batch = 256;
};

// What the CUDA-graph decode path did so far (Model::graph_stats).
struct GraphStats {
  int64_t captured = 0;   // graphs captured (one per padded batch size and context bucket)
  int64_t replayed = 0;   // decode steps that ran as a graph replay
  int64_t eager = 0;      // decode steps that ran eagerly (first use of a shape, or graphs off)
  std::string off_reason; // why graphs are off ("" while they are on or were never tried)
};

struct CacheOptions {
  DType kv_dtype = DType::BF16;     // F32, BF16, FP8_E4M3
  DType index_dtype = DType::BF16;  // F32, BF16, FP8_E4M3
  int64_t num_blocks = 0;           // physical blocks of block_size tokens, shared by all layers
  // Select every block in sparse layers (dense attention everywhere); for quality comparisons.
  bool dense = false;
  // Quality measurement: when set, every full sparse layer also selects blocks from a copy of
  // its index keys stored in this dtype (same activations), and selection_stats() counts how
  // often the two selections agree. The model's output always uses index_dtype.
  bool compare_index = false;
  DType compare_index_dtype = DType::FP8_E4M3;
};

// Agreement between the selections of index_dtype and compare_index_dtype (CacheOptions).
struct SelectionStats {
  int64_t rows = 0;            // (token, index head, full sparse layer) selections compared
  int64_t dropping_rows = 0;   // of those, rows with more candidate blocks than topk
  int64_t selected = 0;        // selected blocks in dropping rows (index_dtype)
  int64_t agreed = 0;          // of those, also selected by compare_index_dtype
  int64_t identical_rows = 0;  // dropping rows whose two selections are the same set
};

// One engine step, as host arrays. Sequence s owns tokens [query_start_loc[s],
// query_start_loc[s+1]); after the step it has seq_lens[s] tokens in the cache. The runner fills
// this from the scheduler's step plan (see kernels/ops.h, "Conventions").
struct StepInputs {
  std::vector<int32_t> token_ids;        // [num_tokens]
  std::vector<int32_t> positions;        // [num_tokens]
  std::vector<int64_t> slot_mapping;     // [num_tokens] physical block * block_size + offset
  std::vector<int32_t> query_start_loc;  // [num_seqs + 1]
  std::vector<int32_t> seq_lens;         // [num_seqs]
  std::vector<int32_t> block_tables;     // [num_seqs, max_blocks_per_seq], unused entries 0
  int max_blocks_per_seq = 0;
  std::vector<int32_t> logits_indices;   // token rows whose logits are wanted, in output order
};

class Model {
 public:
  // Reads DIR/config.json and the safetensors weights (errors name the file/tensor/key).
  static std::unique_ptr<Model> load(const std::string& dir, const LoadOptions& opts = {});
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  int64_t vocab_size() const { return config().vocab_size; }
  int block_size() const { return config().sparse_block_size; }

  // Bytes one cache block (block_size tokens, every layer: K, V, scales, index keys) takes.
  virtual size_t cache_bytes_per_block(DType kv_dtype, DType index_dtype) const = 0;
  // (Re)allocates the paged caches; contents are undefined until written by forward().
  virtual void allocate_caches(const CacheOptions& opts) = 0;
  // Frees the paged caches (forward() then needs allocate_caches() again).
  virtual void release_caches() = 0;
  virtual const CacheOptions& cache_options() const = 0;
  virtual SelectionStats selection_stats() const { return {}; }
  virtual GraphStats graph_stats() const { return {}; }

  // Allocates now the activations of a step of up to max_tokens tokens with one logit row per
  // sequence for up to max_seqs sequences (forward() grows them on demand otherwise), so that
  // a GPU's free memory measured afterwards leaves them out of the cache budget.
  virtual void reserve_step(int64_t max_tokens, int64_t max_seqs) {}

  // Runs one step: writes the new tokens' K/V/index keys into the caches, and fills
  // logits [logits_indices.size(), vocab] (fp32, host memory).
  virtual void forward(const StepInputs& in, std::vector<float>& logits) = 0;
};

// The decode step `in` (one new token per sequence, a logit row for each in order) padded to
// `rows` sequences with tables of `width` blocks: each added sequence holds one token (id 0,
// position 0, slot 0 of `pad_block`), and table entries past a sequence's blocks are
// `pad_block`. The real rows' results do not change. CUDA graphs replay a step captured at
// `rows` sequences for any batch up to it (padding block: a cache block no request owns).
StepInputs pad_decode_step(const StepInputs& in, int rows, int width, int32_t pad_block, int block_size);

// One prefill step of `tokens` tokens (one sequence, through a temporary cache of just enough
// blocks) before serving: it runs every kernel the model needs, so an op the device lacks fails
// at start, and it leaves the kernels' grow-only workspaces allocated, so a GPU's free memory
// measured afterwards leaves them out of the cache budget. The temporary cache is freed at the
// end; the caller allocates the real one.
void warm_up(Model& m, DType kv_dtype, DType index_dtype, int64_t tokens);

}  // namespace sieve::model
