// A deliberately simple MiniMax-M3 forward over one whole sequence, written from the spec with
// plain loops and no paging, sharing no code with src/model or src/kernels. It is the second
// implementation the engine's paged, chunked path is compared against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/config.h"

namespace sieve::testing {

struct ReferenceOptions {
  DType kv_dtype = DType::F32;     // how K/V are stored (values are rounded as stored)
  DType index_dtype = DType::F32;  // how index keys are stored
  bool dense = false;              // select every block
};

// Logits [ids.size(), vocab] for every position of `ids`, from the checkpoint in `dir`.
std::vector<float> reference_logits(const std::string& dir, const ModelConfig& cfg,
                                    const std::vector<int32_t>& ids, const ReferenceOptions& opt);

}  // namespace sieve::testing
