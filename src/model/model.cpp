#include "model/model.h"

#include <cstdio>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/model_internal.h"

#ifdef SIEVE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sieve::model {

DType parse_cache_dtype(const std::string& name, const std::string& flag) {
  if (name == "auto" || name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp8" || name == "fp8_e4m3") return DType::FP8_E4M3;
  if (name == "fp32" || name == "float32") return DType::F32;
  throw Error(flag + ": unknown cache dtype \"" + name + "\" (expected auto, bf16, fp8 or fp32)");
}

CacheOptions cache_options_from_flags(const std::string& kv, const std::string& index) {
  CacheOptions co;
  co.kv_dtype = parse_cache_dtype(kv, "--kv-cache-dtype");
  co.index_dtype = index.empty() ? co.kv_dtype : parse_cache_dtype(index, "--index-cache-dtype");
  return co;
}

std::string cuda_shape_problem(const ModelConfig& c, int tp_size) {
  // The limits of the kernels in kernels/cuda (attention, indexer, qkv_norm_rope_cache, moe).
  auto is = [](const char* key, int64_t v, const std::string& want) {
    return std::string(key) + " = " + std::to_string(v) + " (the CUDA kernels take " + want + ")";
  };
  if (c.head_dim != 128) return is("head_dim", c.head_dim, "128");
  if (c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim) return is("rotary_dim", c.rotary_dim, "an even number up to head_dim");
  if (c.num_key_value_heads > 0 && c.num_attention_heads / c.num_key_value_heads > 16)
    return "num_attention_heads / num_key_value_heads = " + std::to_string(c.num_attention_heads / c.num_key_value_heads) +
           " (the CUDA kernels take query groups of up to 16 heads)";
  if (c.use_sparse_attention) {
    if (c.sparse_index_dim != 128) return is("sparse_index_dim", c.sparse_index_dim, "128");
    if (c.sparse_block_size != 128) return is("sparse_block_size", c.sparse_block_size, "128");
    if (c.sparse_topk_blocks > 32) return is("sparse_topk_blocks", c.sparse_topk_blocks, "up to 32");
  }
  if (c.num_local_experts > 1024) return is("num_local_experts", c.num_local_experts, "up to 1024");
  if (c.num_experts_per_tok > 32) return is("num_experts_per_tok", c.num_experts_per_tok, "up to 32");
  (void)tp_size;
  return "";
}

void device_memory(const Device& dev, size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = 0;
#ifdef SIEVE_HAVE_CUDA
  if (dev.is_cuda() && (cudaSetDevice(dev.index) != cudaSuccess || cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess))
    throw Error("cannot query the memory of " + dev.str());
#else
  (void)dev;
#endif
}

namespace {

double gib(double bytes) { return bytes / double(1ull << 30); }

std::string gib_text(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", gib(bytes));
  return buf;
}

// Dummy weights take every shape from the config, so the keys that set them must be in
// config.json (their code defaults would silently make another model). Read before the config
// is parsed, whose checks would name a consequence rather than the missing key.
void require_shape_keys(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream f(path, std::ios::binary);
  if (!f) return;  // load_model_config names the problem
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception&) {
    return;
  }
  if (!j.is_object()) return;
  const bool vl = j.contains("text_config") && j["text_config"].is_object();
  const nlohmann::json& t = vl ? j["text_config"] : j;
  std::vector<std::string> keys = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                   "head_dim", "vocab_size"};
  if (t.contains("num_local_experts")) {
    keys.push_back("intermediate_size");
    keys.push_back("num_experts_per_tok");
  }
  for (const auto& k : keys)
    if (!t.contains(k))
      throw Error("--load-format dummy: " + path + " has no " + (vl ? "text_config." : "") + k +
                  ", which sets the shape of the weights");
}

}  // namespace

bool regroups_to_blocks128(const LoadOptions& o, const std::string& quant) {
  if (o.fp8_scale_blocks != "auto" && o.fp8_scale_blocks != "128x128")
    throw Error("--fp8-scale-blocks must be auto or 128x128, got \"" + o.fp8_scale_blocks + "\"");
  return o.fp8_scale_blocks == "128x128" && quant == "mxfp8";
}

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadOptions& o) {
  const bool dummy = o.load_format == "dummy";
  if (!dummy && o.load_format != "auto" && o.load_format != "safetensors")
    throw Error("--load-format " + o.load_format + " is not supported (expected auto, safetensors or dummy)");
  if (dummy) require_shape_keys(dir);
  ModelConfig cfg = load_model_config(dir, o.hf_overrides);
  if (cfg.hidden_act != "swigluoai" && cfg.hidden_act != "swiglu_oai")
    throw Error(dir + "/config.json: hidden_act \"" + cfg.hidden_act + "\" is not supported (expected swigluoai)");
  if (cfg.num_local_experts > 0 && cfg.scoring_func != "sigmoid")
    throw Error(dir + "/config.json: scoring_func \"" + cfg.scoring_func + "\" is not supported (expected sigmoid)");
  Device dev = o.device;
  if (dev.is_cuda()) {
    const std::string why = cuda_shape_problem(cfg, o.tp_size);
    if (!why.empty()) {
      if (!o.cpu_fallback) throw Error(dir + "/config.json: this model cannot run on " + dev.str() + ": " + why + "; use --device cpu");
      SIEVE_LOG(Warn, "--device auto: " << dir << " runs on the CPU, not " << dev.str() << ": " << why);
      dev = Device{};
    }
  }
  WeightOptions wo;
  wo.device = dev;
  wo.layout = RankLayout::make(cfg, o.tp_size, o.tp_rank, o.expert_parallel);
  if (o.group && (o.group->size() != o.tp_size || o.group->rank() != o.tp_rank))
    throw Error("the communicator is rank " + std::to_string(o.group->rank()) + " of " +
                std::to_string(o.group->size()) + ", the model rank " + std::to_string(o.tp_rank) + " of " +
                std::to_string(o.tp_size));
  wo.quantization = o.quantization;
  wo.progress = o.progress;
  const std::string quant = effective_quantization(cfg, o.quantization);
  wo.scale_blocks128 = regroups_to_blocks128(o, quant);
  if (o.fp8_scale_blocks == "128x128" && !wo.scale_blocks128)
    SIEVE_LOG(Warn, "--fp8-scale-blocks 128x128 regroups MXFP8 checkpoints only; this model's weights are "
                        << (quant.empty() ? "bf16" : quant) << ": nothing to regroup");
  std::optional<Checkpoint> ckpt;
  if (!dummy) ckpt = Checkpoint::open(dir);
  const size_t need = estimate_weight_bytes(cfg, wo, ckpt ? &*ckpt : nullptr);
  const std::string rank = wo.layout.describe();
  if (dev.is_cuda()) {
    size_t free_b = 0, total_b = 0;
    device_memory(dev, &free_b, &total_b);
    const double budget = double(total_b) * o.gpu_memory_utilization - double(total_b - free_b);
    if (double(need) > budget)
      throw Error("the weights need " + gib_text(double(need)) + " on " + dev.str() + (rank.empty() ? "" : " (" + rank + ")") +
                  ", but --gpu-memory-utilization " + std::to_string(o.gpu_memory_utilization).substr(0, 4) + " of " +
                  gib_text(double(total_b)) + " leaves " + gib_text(std::max(budget, 0.0)) + " (" +
                  gib_text(double(total_b - free_b)) + " already in use): short by " + gib_text(double(need) - budget) +
                  "; use more tensor-parallel ranks, FP8 weights (--quantization fp8) or a larger GPU");
  }
  ModelWeights w = dummy ? dummy_weights(cfg, wo) : load_weights(*ckpt, cfg, wo);
  if (o.progress) o.progress(w.bytes, w.bytes);
  std::string line = "weights: " + gib_text(double(w.bytes)) + " on " + dev.str() + (rank.empty() ? "" : " for " + rank) +
                     " (" + (quant.empty() ? "bf16" : quant) + (dummy ? ", dummy values" : "");
  if (!dummy && w.file_bytes > 0) {
    char ratio[48];
    std::snprintf(ratio, sizeof ratio, " (%.3f x)", double(w.bytes) / double(w.file_bytes));
    line += "; " + gib_text(double(w.file_bytes)) + " of checkpoint tensors read" + ratio;
  }
  if (w.regroup_inexact > 0)
    line += "; " + std::to_string(w.regroup_inexact) + " fp8 values rounded by the " +
            (wo.scale_blocks128 ? "128x128" : "1x128") + " regrouping";
  if (wo.scale_blocks128) line += "; scales regrouped to 128x128 blocks";
  SIEVE_LOG(Info, line << ")");
  return make_minimax_m3(std::move(cfg), wo.layout, std::move(w), dev, o.group, o.side_stream, o.f32_partials);
}

}  // namespace sieve::model
