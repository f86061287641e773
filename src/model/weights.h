// MiniMax-M3 weights as the forward pass uses them: projections fused per layer
// ([q | k | v | index_q | index_k] and [gate | up]), each rank's slices only (rank_layout.h),
// in the formats the kernels read (ops::WeightView):
// - BF16 (or F32) as stored;
// - FP8 E4M3 with fp32 block scales, from an MXFP8 checkpoint (E8M0 per 1 x 32, kept exactly on
//   the CPU, regrouped to 1 x 128 for the CUDA kernels), a Hugging Face fp8 checkpoint (128 x 128
//   float `weight_scale_inv`), or a BF16 checkpoint quantized at load (--quantization fp8, per
//   128 x 128 block, scale = amax / 448).
// Norms, the router, its bias, the embedding and lm_head stay as stored (they are never FP8).
// The same description of every weight (weight_plan.cpp) serves loading, dummy weights (no file
// read) and the memory estimate made before anything is allocated.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "model/rank_layout.h"

namespace sieve::model {

// A weight matrix [rows, cols] on the model's device.
struct Weight {
  Buffer data;
  Buffer scale;  // FP8_E4M3: fp32 [ceil(rows / block_rows), ceil(cols / block_cols)]
  // CUDA, FP8 projections: the same scales as cuBLASLt's block-scaled prefill GEMM reads them
  // (ops::lt_weight_scales; empty where it reads `scale` itself or the weight is an expert's).
  Buffer scale_lt;
  DType dtype = DType::BF16;
  int64_t rows = 0, cols = 0;
  int block_rows = 0, block_cols = 0;  // FP8_E4M3 only
  // CUDA, FP8 experts with (1, 128) blocks: `scale` is tiled (ops::fp8_scales_moe_tiled,
  // ops::MoeExpertsParams::scale_tiled), not the WeightView layout; only the MoE op reads it.
  bool scale_tiled = false;
  ops::WeightView view() const;
  size_t bytes() const { return data.bytes() + scale.bytes() + scale_lt.bytes(); }
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
  // Device arrays of the experts' data and scale pointers (the MoE op's form).
  Buffer expert_gate_up_ptrs, expert_down_ptrs, expert_gate_up_scale_ptrs, expert_down_scale_ptrs;
  bool expert_scale_tiled = false;  // every expert's Weight::scale_tiled (the same for all)
  Weight shared_gate_up;  // [2 * shared_inter, hidden] (empty when no shared expert)
  Weight shared_down;     // [hidden, shared_inter]
};

struct ModelWeights {
  Weight embed;    // [vocab, hidden] (the rank's rows)
  Weight norm;     // F32 [hidden]
  Weight lm_head;  // [vocab, hidden] (the rank's rows)
  std::vector<LayerWeights> layers;
  size_t bytes = 0;          // on the device, every weight and scale
  size_t file_bytes = 0;     // of the checkpoint tensors read (0 for dummy weights)
  int64_t regroup_inexact = 0;  // fp8 values not exact after the 1x32 -> 1x128 or 128x128 regrouping
  // CUDA: the allocations that hold the smaller weights (Weight::data etc. are views into them).
  std::vector<Buffer> arena;
};

struct WeightOptions {
  Device device;
  RankLayout layout;
  // "" (as stored) or "fp8": BF16 projections quantized per 128 x 128 block at load.
  std::string quantization;
  // --fp8-scale-blocks 128x128: an MXFP8 checkpoint's 1 x 32 scales regrouped to one per 128 x
  // 128 block (detail::regroup_block128) on every device, instead of 1 x 128 on CUDA (as stored
  // on the CPU).
  bool scale_blocks128 = false;
  // Called after each weight is on the device with the bytes done so far and the total.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// The quantization a run uses: the checkpoint's (config.quant_method) or --quantization.
// Throws Error for a combination that cannot be (fp8 asked of an mxfp8 checkpoint, unknown names).
std::string effective_quantization(const ModelConfig& cfg, const std::string& quantization);

// Whether routed experts stay FP8 (ops::moe_experts takes FP8 weights with block scales); when
// not, FP8 experts are dequantized at load and --quantization fp8 leaves them BF16.
bool experts_take_fp8();

// Bytes the weights take on `opts.device`, from the config alone (dummy weights) or from the
// checkpoint's tensor headers (nothing is read or allocated).
size_t estimate_weight_bytes(const ModelConfig& cfg, const WeightOptions& opts, const Checkpoint* ckpt);

// Reads every tensor the config calls for (the rank's slices), under the prefixes
// `language_model.model.`, `model.language_model.` or `model.` (vision tensors are ignored). A
// missing or mis-shaped tensor or scale is an Error naming it and the shape expected.
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const WeightOptions& opts);

// Weights of the config's shapes and formats (FP8 where its quantization_config or
// opts.quantization says so) filled with small pseudo-random values on the device; no file read.
ModelWeights dummy_weights(const ModelConfig& cfg, const WeightOptions& opts);

}  // namespace sieve::model
