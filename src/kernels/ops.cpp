#include "kernels/ops.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#ifdef SIEVE_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace sieve::ops {

namespace {
std::mutex g_observer_mu;
std::shared_ptr<const OpObserver> g_observer;  // read under the mutex, called outside it
std::shared_ptr<const IndexerTap> g_indexer_tap;  // the same

std::shared_ptr<const OpObserver> current_observer() {
  std::lock_guard lk(g_observer_mu);
  return g_observer;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void no_cuda(const char* op, const char* why) {
  throw Error(std::string("op ") + op + " is not available on CUDA: " + why);
}
}  // namespace

#ifdef SIEVE_HAVE_CUDA
#define SIEVE_DISPATCH_RAW(op, p, s)                                                   \
  do {                                                                                 \
    if ((s).device.is_cpu()) {                                                         \
      cpu::run_##op(p);                                                                \
    } else if (!cuda::run_##op((p), (s).cuda_stream)) {                                \
      no_cuda(#op, "unsupported parameters (dtype or shape)");                         \
    }                                                                                  \
  } while (0)
#else
#define SIEVE_DISPATCH_RAW(op, p, s)                                                   \
  do {                                                                                 \
    if ((s).device.is_cpu()) {                                                         \
      cpu::run_##op(p);                                                                \
    } else {                                                                           \
      no_cuda(#op, "this build has no CUDA backend");                                  \
    }                                                                                  \
  } while (0)
#endif

#define SIEVE_DISPATCH(op, p, s)                  \
  do {                                            \
    auto observer = current_observer();           \
    if (!observer) {                              \
      SIEVE_DISPATCH_RAW(op, p, s);               \
    } else {                                      \
      const double t0 = now_s();                  \
      SIEVE_DISPATCH_RAW(op, p, s);               \
      (*observer)(#op, t0, now_s());              \
    }                                             \
  } while (0)

void set_op_observer(OpObserver fn) {
  std::lock_guard lk(g_observer_mu);
  g_observer = fn ? std::make_shared<const OpObserver>(std::move(fn)) : nullptr;
}

void matmul(const MatmulParams& p, const Stream& s) { SIEVE_DISPATCH(matmul, p, s); }
void linear(const LinearParams& p, const Stream& s) { SIEVE_DISPATCH(linear, p, s); }
void quantize_fp8(const QuantizeFp8Params& p, const Stream& s) { SIEVE_DISPATCH(quantize_fp8, p, s); }
void embedding(const EmbeddingParams& p, const Stream& s) { SIEVE_DISPATCH(embedding, p, s); }
void rms_norm(const RmsNormParams& p, const Stream& s) { SIEVE_DISPATCH(rms_norm, p, s); }
void add(const AddParams& p, const Stream& s) { SIEVE_DISPATCH(add, p, s); }
void swiglu_oai(const SwigluOaiParams& p, const Stream& s) { SIEVE_DISPATCH(swiglu_oai, p, s); }
void moe_route(const MoeRouteParams& p, const Stream& s) { SIEVE_DISPATCH(moe_route, p, s); }
bool moe_route_splits(const MoeRouteParams& p, const Stream& s) {
#ifdef SIEVE_HAVE_CUDA
  return s.device.is_cuda() && cuda::moe_route_splits(p);
#else
  (void)p;
  (void)s;
  return false;
#endif
}
void moe_experts(const MoeExpertsParams& p, const Stream& s) { SIEVE_DISPATCH(moe_experts, p, s); }
void prefetch_l2(const PrefetchL2Params& p, const Stream& s) { SIEVE_DISPATCH(prefetch_l2, p, s); }
size_t l2_prefetch_budget(int64_t rows, const Stream& s) {
#ifdef SIEVE_HAVE_CUDA
  return s.device.is_cuda() ? cuda::l2_prefetch_budget(rows) : 0;
#else
  (void)rows;
  (void)s;
  return 0;
#endif
}
void qkv_norm_rope_cache(const QkvNormRopeCacheParams& p, const Stream& s) {
  SIEVE_DISPATCH(qkv_norm_rope_cache, p, s);
}
void attention(const AttentionParams& p, const Stream& s) { SIEVE_DISPATCH(attention, p, s); }
void indexer(const IndexerParams& p, const Stream& s) {
  SIEVE_DISPATCH(indexer, p, s);
  if (!s.device.is_cpu()) return;  // the tap sees CPU selections only: no lock on the GPU path
  std::shared_ptr<const IndexerTap> tap;
  {
    std::lock_guard lk(g_observer_mu);
    tap = g_indexer_tap;
  }
  if (tap) (*tap)(p);
}

void set_indexer_tap(IndexerTap fn) {
  std::lock_guard lk(g_observer_mu);
  g_indexer_tap = fn ? std::make_shared<const IndexerTap>(std::move(fn)) : nullptr;
}
void sample(const SampleParams& p, const Stream& s) { SIEVE_DISPATCH(sample, p, s); }

void all_reduce(const AllReduceParams& p, const Stream& s) {
  if (!p.group || p.count == 0) return;
  auto observer = current_observer();
  const double t0 = observer ? now_s() : 0;
  p.group->all_reduce_sum(p.data, p.dtype, p.count, s);
  if (observer) (*observer)("all_reduce", t0, now_s());
}

void all_gather(const AllGatherParams& p, const Stream& s) {
  SIEVE_CHECK(p.group, "all_gather needs a group");
  if (p.count == 0) return;
  auto observer = current_observer();
  const double t0 = observer ? now_s() : 0;
  p.group->all_gather(p.in, p.out, p.dtype, p.count, s);
  if (observer) (*observer)("all_gather", t0, now_s());
}

void build_rope_table(float* cos_sin, int64_t max_position, int rotary_dim, double theta) {
  const int half = rotary_dim / 2;
  std::vector<float> inv_freq(half);
  for (int j = 0; j < half; ++j) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in fp32.
    float expo = float(2 * j) / float(rotary_dim);
    inv_freq[j] = 1.0f / std::pow(float(theta), expo);
  }
  for (int64_t pos = 0; pos < max_position; ++pos) {
    float* row = cos_sin + pos * rotary_dim;
    for (int j = 0; j < half; ++j) {
      float angle = float(pos) * inv_freq[j];
      row[j] = std::cos(angle);
      row[half + j] = std::sin(angle);
    }
  }
}

}  // namespace sieve::ops
