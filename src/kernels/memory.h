// Device memory owned by the layers above kernels/ (model weights, caches, step inputs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.h"

namespace sieve {

class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes);  // zero-filled
  // Bytes [offset, offset + bytes) of `parent`, which must outlive the view; a view frees nothing.
  static Buffer view_of(const Buffer& parent, size_t offset, size_t bytes);
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
  bool owned_ = true;
};

// Host memory that `device` copies to and from at the link's rate: page-locked (cudaMallocHost)
// for a GPU, ordinary 64-byte aligned memory for the CPU. Uninitialised; free with free_host.
void* alloc_host(const Device& device, size_t bytes);
void free_host(const Device& device, void* p);

// Copies between host memory and `device` memory (either may be the CPU).
void copy_to_device(const Device& device, void* dst, const void* src, size_t bytes);
void copy_to_host(const Device& device, void* dst, const void* src, size_t bytes);
void fill_bytes(const Device& device, void* dst, uint8_t value, size_t bytes);
void device_synchronize(const Device& device);
// Makes `device` the calling thread's current CUDA device (the one its kernels launch on; each
// thread has its own); nothing for the CPU.
void use_device(const Device& device);
// A stream for `device`'s kernels that is ordered with the synchronous copies above (a CUDA
// stream that blocks on the legacy default stream), so it can be captured into graphs; null on
// the CPU, whose ops run at once.
void* create_stream(const Device& device);
void destroy_stream(const Device& device, void* stream);

// A second stream beside a main one, for work that does not depend on what the main stream runs
// meanwhile (a MoE layer's shared expert beside its routing). fork(main): what the side stream
// is given next waits for what `main` has been given so far; join(main): what `main` is given
// next waits for what the side stream has been given. Both are an event recorded on one stream
// and waited on by the other, so in a graph capture of `main` the side stream's work becomes a
// branch of the graph beside main's (every fork must be joined before the capture ends). The
// side stream's kernels have scratch of their own (kernels/cuda/stream_scratch.h), so they may
// run beside the main stream's. Empty on the CPU, whose ops run at once.
class SideStream {
 public:
  SideStream() = default;
  explicit SideStream(const Device& device);  // makes the stream on `device` (CUDA)
  ~SideStream();
  SideStream(SideStream&& o) noexcept;
  SideStream& operator=(SideStream&& o) noexcept;
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  explicit operator bool() const { return stream_ != nullptr; }
  void* stream() const { return stream_; }  // a cudaStream_t
  void fork(void* main) const;
  void join(void* main) const;

 private:
  void release();
  Device device_;
  void* stream_ = nullptr;
  void* forked_ = nullptr;  // events
  void* joined_ = nullptr;
};

// Device work captured once from a stream and replayed on it as a whole (a CUDA graph): one
// launch for a whole step's kernels, with their arguments (pointers, shapes) fixed at capture.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  explicit operator bool() const { return exec_ != nullptr; }
  // Enqueues the captured work on `stream` (a stream of create_stream on the same device).
  void replay(void* stream) const;

  // Captures what fn() enqueues on `stream` (from create_stream) without running it; the
  // capture is local to the calling thread. On failure (fn throws, or makes a call that
  // cannot be captured, such as an allocation or a synchronous copy) returns an empty Graph
  // and sets *why, and the device stays usable. Always fails on the CPU.
  static Graph capture(const Device& device, void* stream, const std::function<void()>& fn, std::string* why);

 private:
  void release();
  Device device_;
  void* exec_ = nullptr;
};

// Number of CUDA devices visible (0 in builds without CUDA or on machines without a GPU).
int cuda_device_count();

}  // namespace sieve
