// Device memory owned by the layers above kernels/ (model weights, caches, step inputs).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace sieve {

class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes);  // zero-filled
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }

 private:
  void release();
  Device device_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Copies between host memory and `device` memory (either may be the CPU).
void copy_to_device(const Device& device, void* dst, const void* src, size_t bytes);
void copy_to_host(const Device& device, void* dst, const void* src, size_t bytes);
void fill_bytes(const Device& device, void* dst, uint8_t value, size_t bytes);
void device_synchronize(const Device& device);
// Makes `device` the calling thread's current CUDA device (the one its kernels launch on; each
// thread has its own); nothing for the CPU.
void use_device(const Device& device);
// Number of CUDA devices visible (0 in builds without CUDA or on machines without a GPU).
int cuda_device_count();

}  // namespace sieve
