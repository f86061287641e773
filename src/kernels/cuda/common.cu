// Per-device workspace and counters (see common.cuh), one set per stream_scratch.h set.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/tuning.h"

namespace sieve::cuda {

namespace {
struct DeviceScratch {
  void* ws = nullptr;
  size_t ws_bytes = 0;
  int32_t* counters = nullptr;
  size_t counter_count = 0;
  std::vector<std::pair<void*, size_t>> owned;  // private_scratch, by id
};
std::mutex g_mutex;
// [device][set] (stream_scratch.h); set s > 0 belongs to g_set_owner[s - 1] (null: free).
std::vector<std::vector<DeviceScratch>> g_scratch;
std::vector<cudaStream_t> g_set_owner;

int set_of(cudaStream_t stream) {
  if (!stream) return 0;
  for (size_t i = 0; i < g_set_owner.size(); ++i)
    if (g_set_owner[i] == stream) return int(i) + 1;
  return 0;
}

DeviceScratch& scratch_of(cudaStream_t stream) {
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  if (int(g_scratch.size()) <= dev) g_scratch.resize(size_t(dev) + 1);
  auto& sets = g_scratch[size_t(dev)];
  const size_t set = size_t(set_of(stream));
  if (sets.size() <= set) sets.resize(set + 1);
  return sets[set];
}

void refuse_growth_in_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream, &st), "cudaStreamIsCapturing");
  if (st != cudaStreamCaptureStatusNone)
    throw Error("CUDA kernel workspace must grow during graph capture: run the op once eagerly "
                "with the captured shape before capturing");
}
}  // namespace

void claim_own_scratch(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!stream || set_of(stream) > 0) return;
  for (auto& owner : g_set_owner)
    if (!owner) {
      owner = stream;
      return;
    }
  g_set_owner.push_back(stream);
}

void release_own_scratch(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  // The set's memory stays: graphs captured from the stream may still point at it.
  const int set = set_of(stream);
  if (set > 0) g_set_owner[size_t(set - 1)] = nullptr;
}

int scratch_set(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return set_of(stream);
}

void* workspace(cudaStream_t stream, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceScratch& s = scratch_of(stream);
  if (bytes > s.ws_bytes) {
    refuse_growth_in_capture(stream);
    // The old block stays allocated: a captured graph may still point at it.
    size_t grow = bytes + bytes / 2 + (1 << 20);
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, grow), "cudaMalloc (kernel workspace)");
    s.ws = p;
    s.ws_bytes = grow;
  }
  return s.ws;
}

int32_t* zeroed_counters(cudaStream_t stream, size_t count) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceScratch& s = scratch_of(stream);
  if (count > s.counter_count) {
    refuse_growth_in_capture(stream);
    size_t grow = count * 2 + 1024;
    int32_t* p = nullptr;
    cuda_check(cudaMalloc(&p, grow * sizeof(int32_t)), "cudaMalloc (kernel counters)");
    cuda_check(cudaMemset(p, 0, grow * sizeof(int32_t)), "cudaMemset (kernel counters)");
    s.counters = p;
    s.counter_count = grow;
  }
  return s.counters;
}

void* private_scratch(cudaStream_t stream, int id, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceScratch& s = scratch_of(stream);
  if (int(s.owned.size()) <= id) s.owned.resize(size_t(id) + 1, {nullptr, 0});
  auto& [ptr, have] = s.owned[size_t(id)];
  if (bytes > have) {
    refuse_growth_in_capture(stream);
    const size_t grow = bytes + bytes / 2 + (1 << 16);
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, grow), "cudaMalloc (kernel private scratch)");
    cuda_check(cudaMemset(p, 0, grow), "cudaMemset (kernel private scratch)");
    ptr = p;
    have = grow;
  }
  return ptr;
}

bool pdl_enabled(PdlKernel k, int64_t num_tokens, bool dense) {
  int v = tuning().launch.pdl_mask;
  if (v < 0)
    v = kPdlIndexer |
        (num_tokens <= (dense ? kPdlDenseAttentionMaxTokens : kPdlAttentionMaxTokens) ? kPdlAttention : 0);
  return (v & k) != 0;
}

bool chain_pdl(cudaStream_t stream, int64_t rows) {
  const int v = tuning().launch.chain_pdl;
  return stream != nullptr && (v > 0 || (v < 0 && rows <= kPdlChainMaxRows));
}

bool cache_write_pdl(cudaStream_t stream, int64_t num_tokens) {
  if (tuning().launch.pdl_mask >= 0) return pdl_enabled(kPdlCacheWrite, num_tokens);
  return chain_pdl(stream, num_tokens);
}

int num_sms() {
  static int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 132;
  }();
  return n;
}

unsigned long long* trace_alloc(bool enabled, size_t words, cudaStream_t stream) {
  if (!enabled) return nullptr;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) return nullptr;
  unsigned long long* trace = nullptr;
  cuda_check(cudaMalloc(&trace, words * 8), "trace alloc");
  cuda_check(cudaMemsetAsync(trace, 0, words * 8, stream), "trace memset");
  return trace;
}

std::vector<unsigned long long> trace_collect(unsigned long long* trace, size_t words, cudaStream_t stream) {
  std::vector<unsigned long long> tr(words);
  cuda_check(cudaMemcpyAsync(tr.data(), trace, words * 8, cudaMemcpyDeviceToHost, stream), "trace copy");
  cuda_check(cudaStreamSynchronize(stream), "trace sync");
  cudaFree(trace);
  return tr;
}

bool l2_evict_first(int64_t stream_bytes, int forced) {
  return forced < 0 ? stream_bytes >= kL2HintMinBytes : forced != 0;
}

unsigned long long trace_origin(const std::vector<unsigned long long>& tr, int slots, int64_t ctas) {
  unsigned long long t0 = ~0ull;
  for (int64_t c = 0; c < ctas; ++c)
    if (tr[size_t(c * slots)]) t0 = std::min(t0, tr[size_t(c * slots)]);
  return t0;
}

void print_trace_quantiles(const char* const* names, int points, int slots, const std::vector<unsigned long long>& tr,
                           int64_t ctas) {
  const unsigned long long t0 = trace_origin(tr, slots, ctas);
  for (int i = 0; i < points; ++i) {
    std::vector<double> v;
    for (int64_t c = 0; c < ctas; ++c) {
      const unsigned long long x = tr[size_t(c * slots + i)];
      if (x) v.push_back(double(x - t0) / 1000.0);
    }
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::fprintf(stderr,
                 "  %-12s us from first start: min %7.2f  p10 %7.2f  median %7.2f  p90 %7.2f  max %7.2f  (n %zu)\n",
                 names[i], v.front(), v[v.size() / 10], v[v.size() / 2], v[v.size() * 9 / 10], v.back(), v.size());
  }
}

}  // namespace sieve::cuda
