// Per-device workspace and counters (see common.cuh).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace sieve::cuda {

namespace {
struct DeviceScratch {
  void* ws = nullptr;
  size_t ws_bytes = 0;
  int32_t* counters = nullptr;
  size_t counter_count = 0;
};
std::mutex g_mutex;
std::vector<DeviceScratch> g_scratch;

DeviceScratch& scratch_of_current() {
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  if (int(g_scratch.size()) <= dev) g_scratch.resize(dev + 1);
  return g_scratch[dev];
}

void refuse_growth_in_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream, &st), "cudaStreamIsCapturing");
  if (st != cudaStreamCaptureStatusNone)
    throw Error("CUDA kernel workspace must grow during graph capture: run the op once eagerly "
                "with the captured shape before capturing");
}
}  // namespace

void* workspace(cudaStream_t stream, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceScratch& s = scratch_of_current();
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
  DeviceScratch& s = scratch_of_current();
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

namespace {
std::atomic<int> g_pdl{-1};
}  // namespace
bool pdl_enabled(PdlKernel k) {
  static const int env = [] {
    const char* e = std::getenv("SIEVE_PDL");
    return e && *e ? std::atoi(e) & kPdlAll : 0;
  }();
  const int v = g_pdl.load(std::memory_order_relaxed);
  return ((v < 0 ? env : v) & k) != 0;
}
void set_pdl(int mask) { g_pdl.store(mask < 0 ? -1 : mask & kPdlAll, std::memory_order_relaxed); }

int num_sms() {
  static int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 132;
  }();
  return n;
}

}  // namespace sieve::cuda
