// Programmatic dependent launch along a decode layer's kernels (kernels/bench/decode_chain.h: the
// embedding, the norms with their residual adds and FP8 quantization, the FP8 GEMMs and their
// quantizers, the cache write, routing, SwiGLU-OAI): launched back to back with PDL, and captured
// into CUDA graphs with PDL edges (two layers a graph, so that a layer's first kernels run right
// after the previous layer's last ones over the same buffers), every byte the chain writes equals
// what plain launches with a synchronisation after every op write; and so with the shared expert
// on a side stream beside the routing (kernels/memory.h SideStream: forked, joined, in a graph a
// branch of its own). Each kernel's own parity against the CPU is tested elsewhere. Label gpu:
// skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/bench/decode_chain.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/tuning.h"
#include "kernels/memory.h"

namespace sieve {
namespace {

using namespace sieve::test;
using kernels_bench::ChainShape;
using kernels_bench::DecodeChain;

// Tuning with every PDL of the chain on (pdl), or every launch plain.
cuda::Tuning chain_tuning(bool pdl) {
  cuda::Tuning t;
  t.launch.chain_pdl = pdl ? 1 : 0;
  t.launch.pdl_mask = pdl ? -1 : 0;
  t.linear.pdl = pdl;
  return t;
}

void expect_same(const std::vector<std::vector<uint8_t>>& got, const std::vector<std::vector<uint8_t>>& want,
                 const std::string& what) {
  const std::vector<std::string> names = DecodeChain::output_names();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    size_t diff = 0, first = want[i].size();
    for (size_t j = 0; j < want[i].size(); ++j)
      if (got[i][j] != want[i][j]) first = std::min(first, j), ++diff;
    EXPECT_EQ(diff, 0u) << what << ": " << names[i] << " differs in " << diff << " of " << want[i].size()
                        << " bytes, first at " << first;
  }
}

void check_chain(const ChainShape& shape, uint64_t seed) {
  SCOPED_TRACE(shape.name());
  DecodeChain chain(shape, seed);
  auto* stream = static_cast<cudaStream_t>(create_stream(kGpu));
  std::vector<std::vector<uint8_t>> ref;
  {
    cuda::TuningScope scope(chain_tuning(false));
    chain.poison(stream, 0xff);
    chain.run(stream, true);
    ref = chain.outputs();
  }
  // Not the poison: the chain wrote every output (of the caches, only the step's slots).
  for (size_t i = 0; i < ref.size(); ++i) {
    size_t poisoned = 0;
    for (uint8_t b : ref[i]) poisoned += b == 0xff;
    if (chain.is_cache(i)) {
      EXPECT_LT(poisoned, ref[i].size()) << DecodeChain::output_names()[i] << ": no slot written";
    } else {
      EXPECT_LT(poisoned, ref[i].size() / 4 + 1) << DecodeChain::output_names()[i] << " left poisoned";
    }
  }
  const SideStream side(kGpu);
  ASSERT_TRUE(bool(side));
  for (const bool pdl : {true, false})
    for (const bool beside : {false, true}) {
      cuda::TuningScope scope(chain_tuning(pdl));
      const std::string mode = std::string(pdl ? "PDL" : "plain") + (beside ? ", side stream" : "");
      const SideStream* sp = beside ? &side : nullptr;
      for (int rep = 0; rep < 3; ++rep) {
        chain.poison(stream, uint8_t(0x55 + rep));
        chain.run(stream, false, sp);
        expect_same(chain.outputs(), ref, mode + " back to back, repeat " + std::to_string(rep));
      }
      std::string why;
      Graph g = Graph::capture(
          kGpu, stream,
          [&] {
            chain.run(stream, false, sp);
            chain.run(stream, false, sp);
          },
          &why);
      ASSERT_TRUE(bool(g)) << why;
      for (int rep = 0; rep < 3; ++rep) {
        chain.poison(stream, uint8_t(0x33 + rep));
        g.replay(stream);
        expect_same(chain.outputs(), ref, mode + " graph of two layers, replay " + std::to_string(rep));
      }
    }
  // The side stream in the synchronised order too (each op waited for, on its own stream).
  {
    cuda::TuningScope scope(chain_tuning(false));
    chain.poison(stream, 0x77);
    chain.run(stream, true, &side);
    expect_same(chain.outputs(), ref, "synchronised with the side stream");
  }
  destroy_stream(kGpu, stream);
}

// Every stream shares scratch set 0 but a side stream, which has a set of its own while it lives
// (a later side stream takes over a released one).
TEST(CudaSideStream, HasScratchOfItsOwn) {
  SKIP_WITHOUT_GPU();
  auto* plain = static_cast<cudaStream_t>(create_stream(kGpu));
  EXPECT_EQ(cuda::scratch_set(plain), 0);
  EXPECT_EQ(cuda::scratch_set(nullptr), 0);
  int first = 0;
  {
    const SideStream a(kGpu), b(kGpu);
    first = cuda::scratch_set(static_cast<cudaStream_t>(a.stream()));
    const int second = cuda::scratch_set(static_cast<cudaStream_t>(b.stream()));
    EXPECT_GT(first, 0);
    EXPECT_GT(second, 0);
    EXPECT_NE(first, second);
  }
  const SideStream c(kGpu);
  const int again = cuda::scratch_set(static_cast<cudaStream_t>(c.stream()));
  EXPECT_GT(again, 0);
  EXPECT_LE(again, 2);
  EXPECT_FALSE(bool(SideStream(Device{})));
  destroy_stream(kGpu, plain);
}

// Odd sizes: rows, a hidden size with a partial 128-column group, 3 q heads, 37 experts.
TEST(CudaDecodeChain, OddShapesMatchSynchronised) {
  SKIP_WITHOUT_GPU();
  ChainShape odd;
  odd.rows = 29, odd.hidden = 1040, odd.q_heads = 3, odd.shared_inter = 208, odd.experts = 37, odd.topk = 3;
  odd.vocab = 1001;
  check_chain(odd, 5);
}

// A single row of a small layer (also what the sanitizers run: scripts/chain-check).
TEST(CudaDecodeChain, OneRowMatchesSynchronised) {
  SKIP_WITHOUT_GPU();
  ChainShape one;
  one.rows = 1, one.hidden = 768, one.q_heads = 2, one.shared_inter = 128, one.experts = 16, one.topk = 2;
  check_chain(one, 7);
}

// One TP8 rank of MiniMax-M3 at decode batch 32 (the bench rows' shape).
TEST(CudaDecodeChain, Tp8RankMatchesSynchronised) {
  SKIP_WITHOUT_GPU();
  check_chain(ChainShape{}, 6);
}

}  // namespace
}  // namespace sieve
