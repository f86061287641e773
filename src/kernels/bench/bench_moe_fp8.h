// `sieve bench kernels` rows of the FP8 MoE (bench_moe_fp8.cu), called from run_all.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "kernels/bench/bench.h"

namespace sieve::kernels_bench {

void run_moe_fp8(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row, cudaStream_t st);

}  // namespace sieve::kernels_bench
