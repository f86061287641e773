// Parity of the tensor-core prefill indexer (IndexerKernel::kPrefill, indexer/prefill.cu) with
// the CPU reference on shapes that the small cases of kernels_cuda_test.cpp do not reach: tiles
// whose first warpgroup lies wholly before the diagonal block, chunks after long prefixes (CTAs
// whose stream-K share spans several tiles and requests), long contexts, exact ties, topk 32 with
// forced blocks, several heads, repeated launches (the selection's counters must return to zero).
// The MMA forms and the selection without the overlap are forced through IndexerTuning; each
// configuration runs with and without the block_scores output (without it the score rows live in
// the workspace). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernel_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/tuning.h"
#include "kernels/memory.h"
#include "kernels/ops.h"

namespace sieve {
namespace {

using namespace sieve::test;

using Mma = cuda::IndexerTuning::PrefillMma;

// One configuration of the prefill kernel: its MMA form and whether the selection overlaps the
// scoring grid.
struct PrefillConfig {
  Mma mma = Mma::kAuto;
  bool overlap = true;
};

struct PrefillCase : IndexerInputs {
  int launches = 1;  // > 1: the same inputs again (counters must have returned to zero)
  // Configurations to run (each against the same CPU reference); empty: the defaults only.
  std::vector<PrefillConfig> configs;
};

std::string config_name(const PrefillConfig& c) {
  return "mma " + std::to_string(int(c.mma)) + (c.overlap ? "" : " selection not overlapped");
}

// Every MMA form (the automatic choice, ss, rs, rsp; rsp runs rs with an fp8 cache), and the
// automatic and the pipelined ones with the selection waiting for the whole scoring grid.
const std::vector<PrefillConfig> kConfigs = {{Mma::kAuto, true}, {Mma::kSS, true},   {Mma::kRS, true},
                                             {Mma::kRSP, true},  {Mma::kAuto, false}, {Mma::kRSP, false}};

// The CPU reference once, then the kPrefill kernel `launches` times on poisoned outputs; block
// scores within tolerance (exact for ties), top-k as sets up to near ties (exact order for ties),
// as check_indexer_once in kernels_cuda_test.cpp does.
void check_prefill(const PrefillCase& c, uint64_t seed) {
  SCOPED_TRACE(c.describe() + " seed " + std::to_string(seed));
  IndexerRef r(c, seed);
  const std::vector<PrefillConfig> configs = c.configs.empty() ? std::vector<PrefillConfig>{PrefillConfig{}} : c.configs;
  // Each configuration with the block_scores output, then (configuration runs only) without it.
  const int variants = c.configs.empty() ? 1 : 2;
  for (int run = 0; run < int(configs.size()) * variants * c.launches; ++run) {
    const int launch = run % c.launches, cfg = run / c.launches / variants;
    const bool with_scores = (run / c.launches) % variants == 0;
    cuda::Tuning t;
    t.indexer.prefill_mma = configs[size_t(cfg)].mma;
    t.indexer.prefill_overlap = configs[size_t(cfg)].overlap;
    cuda::TuningScope scope(t);
    SCOPED_TRACE(config_name(configs[size_t(cfg)]) + (with_scores ? "" : " no block_scores") + " launch " +
                 std::to_string(launch));
    r.d_idx.poison(uint8_t(0x55 + launch));
    r.d_scores.poison(0xff);
    r.gpu.block_scores = with_scores ? r.d_scores.as<float>() : nullptr;
    ASSERT_TRUE(cuda::run_indexer_kernel(r.gpu, nullptr, cuda::IndexerKernel::kPrefill));
    device_synchronize(kGpu);
    r.expect_gpu_matches(with_scores);
  }
}

// Tiles that start early in a block (the first warpgroup's 64 rows all precede the next block),
// tiles of 1..2 rows, block-boundary lengths; several heads, topk 32, forced init/local blocks.
TEST(CudaIndexerPrefillV2, BoundaryTilesMatchCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<SeqSpec> specs = {{10, 300}, {200, 129}, {64, 64}, {63, 66}, {1, 255}, {0, 1}, {383, 2}};
  uint64_t seed = 7000;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    PrefillCase c;
    c.specs = specs;
    c.cache = cd;
    c.H = 3;
    c.topk = 32, c.init = 2, c.local = 3;
    check_prefill(c, seed++);
    c.q_dtype = DType::F32;
    c.q_in_cache = cd == DType::FP8_E4M3;
    c.H = 1;
    c.topk = 5, c.init = 0, c.local = 0;
    check_prefill(c, seed++);
  }
}

// A chunked prefill after a long prefix, plus decode rows with long contexts in the same batch;
// run twice (counters back to zero).
TEST(CudaIndexerPrefillV2, ManySplitsMatchCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<SeqSpec> specs = {{20000, 300}, {0, 1}, {17000, 1}, {3000, 200}};
  uint64_t seed = 7100;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    PrefillCase c;
    c.specs = specs;
    c.cache = cd;
    c.H = 2;
    c.init = 1;
    c.launches = 2;
    c.configs = kConfigs;
    check_prefill(c, seed++);
  }
}

// Long contexts (782 and 1407 key blocks a row).
TEST(CudaIndexerPrefillV2, WideSplitsMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7200;
  for (const auto& specs : {std::vector<SeqSpec>{{100000, 64}, {500, 140}},
                            std::vector<SeqSpec>{{180000, 40}, {0, 130}}}) {
    PrefillCase c;
    c.specs = specs;
    c.cache = specs[0].cached > 150000 ? DType::FP8_E4M3 : DType::BF16;
    c.topk = 32, c.init = 1, c.local = 2;
    check_prefill(c, seed++);
  }
}

// Exact ties: the order must match the CPU's "higher score, then lower block id" exactly, also
// where equal scores come from different CTAs' shares of a tile.
TEST(CudaIndexerPrefillV2, ExactTiesAcrossSplits) {
  SKIP_WITHOUT_GPU();
  const std::vector<SeqSpec> specs = {{5000, 200}, {10, 300}, {9000, 1}};
  uint64_t seed = 7300;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    PrefillCase c;
    c.specs = specs;
    c.cache = cd;
    c.ties = true;
    c.H = 2;
    c.topk = 32;
    c.configs = kConfigs;
    check_prefill(c, seed++);
  }
}

// The query-tile load paths: bf16 q by cp.async (aligned rows), bf16 q element-wise (rows not
// 16-byte aligned), bf16 q rounded to fp8 (q_in_cache_dtype with an fp8 cache), f32 q.
TEST(CudaIndexerPrefillV2, QueryLayoutsMatchCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<SeqSpec> specs = {{100, 300}, {0, 1}, {900, 140}};
  uint64_t seed = 7500;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    PrefillCase c;
    c.specs = specs;
    c.cache = cd;
    c.H = 2;
    c.q_pad = 4;
    check_prefill(c, seed++);
    c.q_pad = 8;
    c.q_in_cache = true;
    check_prefill(c, seed++);
    c.q_dtype = DType::F32;
    c.q_pad = 1;
    check_prefill(c, seed++);
  }
}

// A multi-tile prompt chunk (12 tiles) with several heads.
TEST(CudaIndexerPrefillV2, PromptChunkMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7400;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    PrefillCase c;
    c.specs = {{3000, 1500}};
    c.cache = cd;
    c.H = 2;
    c.configs = kConfigs;
    check_prefill(c, seed++);
  }
}

// ---------------------------------------------------------------------------------------------
// Every configuration of kConfigs, with and without block_scores, against one CPU reference per
// shape.

// The benchmark's shape at a smaller size: one prompt of 4000 tokens (32 tiles), one index head,
// topk 16, local 1; bf16 cache.
TEST(CudaIndexerPrefillSelect, PromptBf16MatchesCpu) {
  SKIP_WITHOUT_GPU();
  PrefillCase c;
  c.specs = {{0, 4000}};
  c.configs = kConfigs;
  check_prefill(c, 8000);
}

// The same prompt with an fp8 cache, q rounded to fp8 (q_in_cache_dtype), topk 32, init 1.
TEST(CudaIndexerPrefillSelect, PromptFp8MatchesCpu) {
  SKIP_WITHOUT_GPU();
  PrefillCase c;
  c.specs = {{0, 4000}};
  c.cache = DType::FP8_E4M3;
  c.q_in_cache = true;
  c.topk = 32, c.init = 1;
  c.configs = kConfigs;
  check_prefill(c, 8001);
}

// A 12-tile chunk after a 3000-token prefix, two heads.
TEST(CudaIndexerPrefillSelect, ChunkAfterPrefixMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 8100;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    PrefillCase c;
    c.specs = {{3000, 1500}};
    c.cache = cd;
    c.H = 2;
    c.configs = kConfigs;
    check_prefill(c, seed++);
  }
}

// Chunks after long prefixes mixed with decode rows (one-row tiles with 133 visible blocks);
// two launches per configuration (the counters must return to zero).
TEST(CudaIndexerPrefillSelect, MixedDecodeRowsMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 8200;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    PrefillCase c;
    c.specs = {{20000, 300}, {0, 1}, {17000, 1}, {3000, 200}};
    c.cache = cd;
    c.H = 2;
    c.init = 1;
    c.launches = 2;
    c.configs = kConfigs;
    check_prefill(c, seed++);
  }
}

// Exact ties: the order must be "higher score, then lower block id" exactly.
TEST(CudaIndexerPrefillSelect, ExactTiesMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 8300;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    PrefillCase c;
    c.specs = {{5000, 200}, {10, 300}, {9000, 1}};
    c.cache = cd;
    c.ties = true;
    c.H = 2;
    c.topk = 32;
    c.configs = kConfigs;
    check_prefill(c, seed++);
  }
}

// Tiles of 1..2 rows, rows that see fewer blocks than topk (slots -1), block-boundary lengths,
// three heads with forced init/local blocks; f32 q; q rows not 16-byte aligned.
TEST(CudaIndexerPrefillSelect, BoundaryTilesMatchCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<SeqSpec> specs = {{10, 300}, {200, 129}, {64, 64}, {63, 66}, {1, 255}, {0, 1}, {383, 2}};
  uint64_t seed = 8400;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    PrefillCase c;
    c.specs = specs;
    c.cache = cd;
    c.H = 3;
    c.topk = 32, c.init = 2, c.local = 3;
    c.configs = kConfigs;
    check_prefill(c, seed++);
    c.q_dtype = DType::F32;
    c.q_in_cache = cd == DType::FP8_E4M3;
    c.H = 1;
    c.topk = 5, c.init = 0, c.local = 0;
    c.q_pad = 1;
    check_prefill(c, seed++);
  }
}

// Long contexts (782 and 1407 blocks a row: 25 and 44 blocks per lane in the selection).
TEST(CudaIndexerPrefillSelect, LongContextsMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 8500;
  for (const auto& specs : {std::vector<SeqSpec>{{100000, 64}, {500, 140}},
                            std::vector<SeqSpec>{{180000, 40}, {0, 130}}}) {
    PrefillCase c;
    c.specs = specs;
    c.cache = specs[0].cached > 150000 ? DType::FP8_E4M3 : DType::BF16;
    c.topk = 32, c.init = 1, c.local = 2;
    c.configs = kConfigs;
    check_prefill(c, seed++);
  }
}

}  // namespace
}  // namespace sieve
