// The small-kernel chain of one decode layer, as MiniMaxM3's enqueue_step issues it
// (src/model/minimax_m3.cpp), without attention, the indexer and the routed experts: the input
// norm quantized for the qkv projection, the qkv GEMM, the cache write, o_proj over a fixed
// attention output, the post-attention residual add + norm (fp32 rows for the router and their
// FP8 copy for the experts), routing (router GEMM + top-k), the shared expert (gate_up,
// SwiGLU-OAI quantized, down) and the next layer's input norm. The sublayer outputs (o_proj's and
// the shared expert's down projection's, `part`) are bf16 as the CUDA model writes them, each
// norm adding them to the fp32 residual (RmsNormParams::residual_f32), or fp32 with
// ChainShape::f32_partials (LoadOptions::f32_partials, for comparison); the
// embedding first, so that one call starts from the same residual stream every time and its
// outputs depend only on its inputs. The "decode chain" rows of `sieve bench kernels` time it from
// CUDA graphs with and without programmatic dependent launch, and with the shared expert on a
// side stream beside the routing as the model runs it (kernels/memory.h SideStream);
// kernels_cuda_chain_test checks that graphs and back-to-back launches of it give what
// synchronised plain launches give, bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sieve {
class SideStream;
}

namespace sieve::kernels_bench {

struct ChainShape {
  int64_t rows = 32;       // decode tokens
  int64_t hidden = 6144;
  int q_heads = 8;         // q heads of the rank; one kv head, one index head, head and index dim 128
  int64_t shared_inter = 384;  // the rank's columns of the shared expert's intermediate
  int experts = 128, topk = 4;
  int64_t vocab = 4096;    // embedding rows
  bool f32_partials = false;  // part fp32 instead of bf16 (the model's --f32-partials)
  std::string name() const;
};

class DecodeChain {
 public:
  DecodeChain(const ChainShape& shape, uint64_t seed);
  ~DecodeChain();
  DecodeChain(const DecodeChain&) = delete;
  DecodeChain& operator=(const DecodeChain&) = delete;

  // Enqueues the chain on `stream` (graph-capturable once it has run eagerly with this shape).
  // sync: synchronise the stream after every op (nothing overlaps: the reference order). side:
  // the shared expert on side->stream(), forked from `stream` after the post-attention norm and
  // joined before the next norm (it runs beside the routing). ops >= 0: only the chain's first
  // `ops` ops (op_names(); one stream only), so that the differences between prefixes' times show
  // what each op adds where it runs in the chain.
  void run(cudaStream_t stream, bool sync = false, const SideStream* side = nullptr, int ops = -1) const;
  // The chain's ops in order (a GEMM with its input's quantizer is one op).
  static std::vector<std::string> op_names();
  // Every byte the chain writes, buffer by buffer (synchronises the device).
  std::vector<std::vector<uint8_t>> outputs() const;
  // Names of outputs()' buffers.
  static std::vector<std::string> output_names();
  // Sets every byte the chain writes to `byte`, on `stream`; the caches (is_cache), of which the
  // chain writes only the step's slots, always to 0xff.
  void poison(cudaStream_t stream, uint8_t byte) const;
  bool is_cache(size_t output) const;
  // Bytes a call must move: the weights once, every activation written once and read where used.
  double bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace sieve::kernels_bench
