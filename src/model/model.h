// The MiniMax-M3 text model: weights by the published tensor names, paged KV + index caches, and
// the forward pass of one engine step (prefill chunks and decodes mixed) over a step already on
// its device, written against kernels/ops.h only. Running steps (inputs, CUDA graphs, logits to
// the host) is the runner's job (engine/runner.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/config.h"
#include "kernels/ops.h"

namespace sieve::model {

// Cache dtype names as users give them: auto (the model dtype, bf16), bf16, fp8, fp32.
DType parse_cache_dtype(const std::string& name, const std::string& flag);

struct LoadOptions {
  std::string hf_overrides;  // JSON object text merged over the text config
  Device device;             // CPU (the reference backend) or CUDA
  // --device auto: a model whose shapes the CUDA kernels do not take loads on the CPU instead
  // (with a warning); otherwise such a model is refused on CUDA with an Error naming the shape.
  bool cpu_fallback = false;
  // "" (weights as stored) or "fp8" (--quantization fp8: BF16 projections quantized per
  // 128 x 128 block at load).
  std::string quantization;
  // --fp8-scale-blocks: "auto" (an MXFP8 checkpoint's 1 x 32 scales regrouped to 1 x 128 on CUDA,
  // as stored on the CPU) or "128x128" (regrouped to one scale per 128 x 128 block on every
  // device: the GPU's (128, 128) kernels, faster at prefill; values rescaled by powers of two,
  // exact unless they fall into fp8's subnormal range; docs/quality.md). Other checkpoints: no
  // effect.
  std::string fp8_scale_blocks = "auto";
  // "auto" (the safetensors weights of the directory) or "dummy" (weights of the config's
  // shapes and formats made on the device; no weight file is read).
  std::string load_format = "auto";
  // Tensor parallelism: the model is this rank's shard (rank_layout.h). With tp_size > 1 and a
  // group (this rank's handle on a communicator of tp_size ranks, kept alive by the caller) the
  // forward adds up the ranks' partial sums (all_reduce after o_proj, the MLP/MoE and the
  // embedding) and gathers the logits; without one (sieve bench step --tp-rank-of) the rank's
  // work runs alone and its outputs are partial.
  int tp_size = 1, tp_rank = 0;
  ops::Collective* group = nullptr;
  // --enable-expert-parallel: routed experts dealt out whole over the ranks instead of split.
  bool expert_parallel = false;
  // CUDA: the weights must fit in this fraction of the device's memory (what other processes
  // hold counts against it); checked before anything is allocated.
  double gpu_memory_utilization = 0.9;
  // CUDA: each MoE layer's shared expert runs on a second stream beside the layer's routing
  // (joined before the routed experts; the same ops on the same inputs, so the same results)
  // where the routing runs its split-K router GEMM (ops::moe_route_splits: decode batches), after
  // it on the one stream otherwise; false (--no-side-stream): always after it. On an H100, one
  // TP8 rank's decode step took 22.36 ms with the two together against 22.75 ms with neither
  // (the side stream without the split-K GEMM: 24.0 ms; docs/performance.md "The decode chain").
  // With the tuning field launch.l2_prefetch_mib (an experiment, off by default), decode steps
  // also prefetch the next layer's weights into L2 on a third stream beside the routing
  // (ops::prefetch_l2); false: neither.
  bool side_stream = true;
  // CUDA: keep each sublayer's output (`part`: o_proj, the MLP's or shared expert's down
  // projection, the MoE combine) and its tensor-parallel all-reduce in fp32 instead of bf16 (the
  // default, as vLLM and SGLang: half the bytes). For comparisons (--f32-partials); the CPU is
  // fp32 either way.
  bool f32_partials = false;
  // Called as weights reach the device: bytes done, bytes in all.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Whether o.fp8_scale_blocks regroups a model of quantization `quant` (effective_quantization):
// 128x128 and an MXFP8 checkpoint. Throws Error for a value other than auto or 128x128.
bool regroups_to_blocks128(const LoadOptions& o, const std::string& quant);

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

// One step as the model reads it, on the model's device (see kernels/ops.h, "Conventions"):
// the sequence layout, the new tokens' ids, positions and cache slots, and where the logits go.
// The runner (engine/runner.h) makes it from host arrays; every grid comes from the host bounds
// here, never from the device arrays, so a step can be captured once and replayed.
struct StepView {
  ops::BatchView batch;                   // query starts, lengths, tables; max_seq_len, max_query_len
  const int32_t* token_ids = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;     // [num_tokens]
  const int64_t* slot_mapping = nullptr;  // [num_tokens] physical block * block_size + offset
  int max_position = 0;                   // no position is larger (host bound)
  // Token rows whose logits are wanted, in output order (host memory: a captured step keeps them).
  std::span<const int32_t> logits_rows;
  // [logits_rows.size(), vocab] fp32 on the device; in vocabulary shards when the model has
  // several (Model::logits_shards).
  float* logits = nullptr;
  // Speculative decoding (EAGLE3): the residual stream entering each layer of aux_layers (host
  // list), for every token of the step, fp32 on the device: aux_hidden[i, t, :] for
  // aux_layers[i]. Empty list: not written.
  std::span<const int> aux_layers;
  float* aux_hidden = nullptr;  // [aux_layers.size(), num_tokens, hidden]
};

class Model {
 public:
  // Reads DIR/config.json and the safetensors weights (errors name the file/tensor/key).
  static std::unique_ptr<Model> load(const std::string& dir, const LoadOptions& opts = {});
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const Device& device() const = 0;
  int64_t vocab_size() const { return config().vocab_size; }
  int block_size() const { return config().sparse_block_size; }

  // Bytes one cache block (block_size tokens, every layer: K, V, scales, index keys) takes.
  virtual size_t cache_bytes_per_block(DType kv_dtype, DType index_dtype) const = 0;
  // (Re)allocates the paged caches with one block more than opts.num_blocks: block
  // opts.num_blocks belongs to no sequence (the padding rows of captured decode steps write
  // there). Contents are undefined until written by forward().
  virtual void allocate_caches(const CacheOptions& opts) = 0;
  // Frees the paged caches (forward() then needs allocate_caches() again).
  virtual void release_caches() = 0;
  virtual const CacheOptions& cache_options() const = 0;
  virtual SelectionStats selection_stats() const { return {}; }
  // Bytes the weights (and their scales) take on the device.
  virtual size_t weight_bytes() const { return 0; }

  // Allocates now the activations of a step of up to max_tokens tokens with up to
  // max_logit_rows logit rows (forward() grows them on demand otherwise), so that a GPU's free
  // memory measured afterwards leaves them out of the cache budget.
  virtual void reserve_step(int64_t max_tokens, int64_t max_logit_rows) {}

  // The input embedding [vocab, hidden] on the model's device (an EAGLE3 draft without one of its
  // own reads it); empty when the model has none to share.
  virtual ops::WeightView input_embedding() const { return {}; }

  // The logits rows of forward() come in this many vocabulary shards: step.logits holds
  // [shards, rows, vocab / shards] (shard i: ids [i * vocab / shards, (i + 1) * vocab / shards)),
  // which is [rows, vocab] for one shard. The runner puts the rows back together on the host.
  virtual int logits_shards() const { return 1; }

  // The dtype of each sublayer's output and of its tensor-parallel all-reduce (F32 on the CPU;
  // BF16 on CUDA unless LoadOptions::f32_partials).
  virtual DType partials_dtype() const { return DType::F32; }

  // Counts replacements of the device buffers forward() uses besides its arguments (caches,
  // activations, tables): work captured from forward() before a change must not be replayed.
  virtual uint64_t buffers_epoch() const { return 0; }

  // Enqueues one step on `stream` (the CPU runs it at once): writes the new tokens' K/V/index
  // keys into the caches and the logits of step.logits_rows into step.logits. Once its buffers
  // have grown to a step's shape, nothing in it allocates or synchronises with the host.
  virtual void forward(const StepView& step, const ops::Stream& stream) = 0;
};

// Cache dtypes as the flags give them: `index` empty means "follow the kv cache dtype".
CacheOptions cache_options_from_flags(const std::string& kv, const std::string& index);

// Why the CUDA kernels cannot run this model (its shapes, for one rank of tp_size), naming the
// config key and the value they need; "" when they can.
std::string cuda_shape_problem(const ModelConfig& cfg, int tp_size = 1);

// Free and total bytes of a CUDA device (0, 0 in a build without CUDA).
void device_memory(const Device& dev, size_t* free_bytes, size_t* total_bytes);

}  // namespace sieve::model
