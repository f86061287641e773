// Device allocation and copies for kernels/memory.h.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <string>

#include "core/error.h"

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

}  // namespace sieve::cuda_mem
