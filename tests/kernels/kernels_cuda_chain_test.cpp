// Programmatic dependent launch along a decode layer's kernels (kernels/bench/decode_chain.h: the
// embedding, the norms with their residual adds and FP8 quantization, the FP8 GEMMs and their
// quantizers, the cache write, routing, SwiGLU-OAI): launched back to back with PDL, and captured
// into CUDA graphs with PDL edges (two layers a graph, so that a layer's first kernels run right
// after the previous layer's last ones over the same buffers), every byte the chain writes equals
// what plain launches with a synchronisation after every op write; and so with the shared expert
// on a side stream beside the routing (kernels/memory.h SideStream: forked, joined, in a graph a
// branch of its own). The chain's sublayer outputs are bf16 as the model writes them, or fp32
// (ChainShape::f32_partials): both orders are checked with both, and the bf16 chain against the
// fp32 one within what rounding the two sublayer outputs to bf16 moves (below). Each kernel's own
// parity against the CPU is tested elsewhere (rms_norm with a bf16 x and an fp32 residual, the
// FP8 GEMM's bf16 y included). Label gpu: skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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
ChainShape odd_shape() {
  ChainShape odd;
  odd.rows = 29, odd.hidden = 1040, odd.q_heads = 3, odd.shared_inter = 208, odd.experts = 37, odd.topk = 3;
  odd.vocab = 1001;
  return odd;
}

TEST(CudaDecodeChain, OddShapesMatchSynchronised) {
  SKIP_WITHOUT_GPU();
  check_chain(odd_shape(), 5);
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

// The fp32 sublayer outputs of --f32-partials (the bench's comparison rows).
TEST(CudaDecodeChain, F32PartialsMatchSynchronised) {
  SKIP_WITHOUT_GPU();
  ChainShape odd = odd_shape();
  odd.f32_partials = true;
  check_chain(odd, 5);
  ChainShape tp8;
  tp8.f32_partials = true;
  check_chain(tp8, 6);
}

// An output buffer of `dtype` (F32 or BF16) as floats.
std::vector<float> as_floats(const std::vector<uint8_t>& bytes, bool bf16) {
  std::vector<float> v(bytes.size() / (bf16 ? 2 : 4));
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits = 0;
    if (bf16) {
      uint16_t h = 0;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      bits = uint32_t(h) << 16;
    } else {
      std::memcpy(&bits, bytes.data() + 4 * i, 4);
    }
    std::memcpy(&v[i], &bits, 4);
  }
  return v;
}

// The bf16-partials chain against the fp32-partials one over the same inputs (synchronised plain
// launches). The two differ by rounding o_proj's and the shared down projection's outputs (values
// of order one) to bf16, 2^-9 relative each, and by what that moves downstream: FP8 codes of the
// normed rows and of the activation that flip at a rounding boundary (a step of 2^-3 relative on
// a few per cent of the elements), which move the down projection by ~1e-2. So: every value
// within 2^-3 (plus 2^-3 relative), the mean difference within 2^-3 of the mean magnitude, and
// the residual different in most elements (the bf16 rounding happened). Reading a bf16 part as
// fp32, or the reverse, is off by orders of magnitude.
void check_bf16_follows_f32(ChainShape shape, uint64_t seed) {
  SCOPED_TRACE(shape.name());
  shape.f32_partials = false;
  DecodeChain bf(shape, seed);
  shape.f32_partials = true;
  DecodeChain f32(shape, seed);
  auto* stream = static_cast<cudaStream_t>(create_stream(kGpu));
  std::vector<std::vector<uint8_t>> got, want;
  {
    cuda::TuningScope scope(chain_tuning(false));
    bf.poison(stream, 0x55);
    bf.run(stream, true);
    got = bf.outputs();
    f32.poison(stream, 0x55);
    f32.run(stream, true);
    want = f32.outputs();
  }
  destroy_stream(kGpu, stream);
  const std::vector<std::string> names = DecodeChain::output_names();
  // h (after both adds), part (the shared down projection's output), the post-attention norm's
  // fp32 rows.
  for (const char* name : {"h", "part", "xf"}) {
    const size_t i = size_t(std::find(names.begin(), names.end(), name) - names.begin());
    ASSERT_LT(i, names.size()) << name;
    const std::vector<float> g = as_floats(got[i], std::string(name) == "part");
    const std::vector<float> w = as_floats(want[i], false);
    ASSERT_EQ(g.size(), w.size()) << name;
    double sum_diff = 0, sum_mag = 0, worst = 0;
    size_t differ = 0, bad = 0;
    for (size_t j = 0; j < w.size(); ++j) {
      ASSERT_TRUE(std::isfinite(w[j]) && std::isfinite(g[j])) << name << " [" << j << "]: " << g[j] << " vs " << w[j];
      const double d = std::fabs(double(g[j]) - double(w[j]));
      sum_diff += d, sum_mag += std::fabs(double(w[j]));
      worst = std::max(worst, d);
      differ += g[j] != w[j];
      bad += d > 0.125 * (1 + std::fabs(double(w[j])));
    }
    EXPECT_EQ(bad, 0u) << name << ": largest difference " << worst;
    EXPECT_LE(sum_diff, sum_mag / 8) << name << ": mean difference " << sum_diff / double(w.size())
                                      << ", mean magnitude " << sum_mag / double(w.size());
    if (std::string(name) == "h") {
      EXPECT_GT(differ, w.size() / 2) << "h: the sublayer outputs were not rounded";
    }
  }
}

TEST(CudaDecodeChain, Bf16PartialsFollowF32Partials) {
  SKIP_WITHOUT_GPU();
  check_bf16_follows_f32(odd_shape(), 5);
  check_bf16_follows_f32(ChainShape{}, 6);
}

}  // namespace
}  // namespace sieve
