// Device allocation and copies for kernels/memory.h.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>

#include "core/error.h"
#include "kernels/cuda/stream_scratch.h"

namespace sieve::cuda_mem {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}
}  // namespace

void* alloc(int device, size_t bytes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
void free(int device, void* p) {
  cudaSetDevice(device);
  cudaFree(p);
}
void copy_h2d(int device, void* dst, const void* src, size_t bytes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
void copy_d2h(int device, void* dst, const void* src, size_t bytes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
void* alloc_host(int device, size_t bytes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes), "cudaMallocHost");
  return p;
}
void free_host(int device, void* p) {
  cudaSetDevice(device);
  cudaFreeHost(p);
}
void fill(int device, void* dst, uint8_t value, size_t bytes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaMemset(dst, value, bytes), "cudaMemset");
}
void sync(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}
void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void* create_stream(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s = nullptr;
  check(cudaStreamCreate(&s), "cudaStreamCreate");  // blocking: ordered with the legacy stream
  return s;
}
void destroy_stream(int device, void* stream) {
  cudaSetDevice(device);
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

// A side stream (SideStream in kernels/memory.h): blocking like create_stream's, with scratch of
// its own; its events record no timing (the cheapest kind to record and wait on).
void create_side_stream(int device, void** stream, void** forked, void** joined) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s = nullptr;
  cudaEvent_t f = nullptr, j = nullptr;
  check(cudaStreamCreate(&s), "cudaStreamCreate (side stream)");
  cudaError_t e = cudaEventCreateWithFlags(&f, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&j, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    if (f) cudaEventDestroy(f);
    cudaStreamDestroy(s);
    check(e, "cudaEventCreate (side stream)");
  }
  sieve::cuda::claim_own_scratch(s);
  *stream = s, *forked = f, *joined = j;
}
void destroy_side_stream(int device, void* stream, void* forked, void* joined) {
  cudaSetDevice(device);
  sieve::cuda::release_own_scratch(static_cast<cudaStream_t>(stream));
  cudaEventDestroy(static_cast<cudaEvent_t>(forked));
  cudaEventDestroy(static_cast<cudaEvent_t>(joined));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}
// `to` waits for what `from` has enqueued so far (in a capture: a dependency edge).
void stream_wait(void* from, void* to, void* event) {
  cudaEvent_t e = static_cast<cudaEvent_t>(event);
  check(cudaEventRecord(e, static_cast<cudaStream_t>(from)), "cudaEventRecord");
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(to), e, 0), "cudaStreamWaitEvent");
}

void* graph_capture(int device, void* stream, const std::function<void()>& fn, std::string* why) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (!st) {
    *why = "capture needs a stream of its own, not the legacy default stream";
    return nullptr;
  }
  check(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  std::string err;
  try {
    fn();
  } catch (const std::exception& e) {
    err = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(st, &graph);
  if (err.empty() && ended != cudaSuccess) err = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
  cudaGraphExec_t exec = nullptr;
  if (err.empty()) {
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    if (e != cudaSuccess) {
      err = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e);
      exec = nullptr;
    }
  }
  if (graph) cudaGraphDestroy(graph);
  if (!err.empty()) {
    cudaGetLastError();  // a refused call inside the capture leaves its error behind
    *why = err;
    return nullptr;
  }
  return exec;
}
void graph_replay(int device, void* exec, void* stream) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(stream)), "cudaGraphLaunch");
}
void graph_destroy(int device, void* exec) {
  cudaSetDevice(device);
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

}  // namespace sieve::cuda_mem
