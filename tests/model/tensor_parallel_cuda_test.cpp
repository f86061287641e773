// Tensor parallelism's CUDA path on one GPU (label gpu; skipped without a CUDA device or NCCL):
// the bundled model with an NCCL group of one rank, whose collectives run (all_reduce: the
// identity, on the bf16 sublayer outputs by default and on fp32 ones with f32_partials; the
// logits through all_gather) and are captured in the decode steps' CUDA graphs, gives the plain
// path's log-probs bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "engine/runner.h"
#include "kernels/memory.h"
#include "model/model.h"
#include "parallel/nccl_group.h"
#include "tp_util.h"

namespace sieve {
namespace {

const std::string kModel = std::string(SIEVE_SOURCE_DIR) + "/models/minimax-m3-tiny";

struct Outcome {
  std::vector<float> logprobs;
  std::vector<int32_t> greedy;
  engine::GraphStats graphs;
};

Outcome run(model::Model& m, const std::vector<int32_t>& prompt) {
  engine::Runner r(m);
  model::CacheOptions co;
  co.kv_dtype = co.index_dtype = DType::BF16;
  co.num_blocks = testing::kBlocks;
  r.allocate_caches(co);
  Outcome out;
  out.logprobs = testing::run_sequence(r, prompt, 113, 12, &out.greedy);
  out.graphs = r.graph_stats();
  return out;
}

class TensorParallelCuda : public ::testing::TestWithParam<bool> {};  // f32_partials

TEST_P(TensorParallelCuda, NcclGroupOfOneEqualsThePlainPathBitForBit) {
  if (cuda_device_count() == 0 || !parallel::have_nccl())
    GTEST_SKIP() << "no CUDA device or no NCCL";
  model::LoadOptions lo;
  lo.device = Device{DeviceKind::CUDA, 0};
  lo.f32_partials = GetParam();
  auto plain = model::Model::load(kModel, lo);
  EXPECT_EQ(plain->partials_dtype(), GetParam() ? DType::F32 : DType::BF16);
  const auto prompt = testing::random_prompt(300, plain->vocab_size(), 5);
  const Outcome a = run(*plain, prompt);
  plain.reset();
  auto comm = parallel::nccl_collective(parallel::nccl_unique_id(), 0, 1, 0);
  lo.group = comm.get();
  auto grouped = model::Model::load(kModel, lo);
  const Outcome b = run(*grouped, prompt);
  EXPECT_GT(b.graphs.replayed, 0) << "the decode steps did not replay graphs: "
                                  << b.graphs.off_reason;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
  EXPECT_EQ(std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * sizeof(float)),
            0);
  EXPECT_EQ(a.greedy, b.greedy);
  grouped.reset();
}

INSTANTIATE_TEST_SUITE_P(Partials, TensorParallelCuda, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "F32" : "Bf16"; });

}  // namespace
}  // namespace sieve
