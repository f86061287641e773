#include "model/model.h"

#include "core/error.h"

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

}  // namespace sieve::model
