#include "kernels/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "core/error.h"

namespace sieve {

#ifdef SIEVE_HAVE_CUDA
namespace cuda_mem {
void* alloc(int device, size_t bytes);
void free(int device, void* p);
void copy_h2d(int device, void* dst, const void* src, size_t bytes);
void copy_d2h(int device, void* dst, const void* src, size_t bytes);
void* alloc_host(int device, size_t bytes);
void free_host(int device, void* p);
void fill(int device, void* dst, uint8_t value, size_t bytes);
void sync(int device);
void set_device(int device);
int device_count();
void* create_stream(int device);
void destroy_stream(int device, void* stream);
void create_side_stream(int device, void** stream, void** forked, void** joined);
void destroy_side_stream(int device, void* stream, void* forked, void* joined);
void stream_wait(void* from, void* to, void* event);
void* graph_capture(int device, void* stream, const std::function<void()>& fn, std::string* why);
void graph_replay(int device, void* exec, void* stream);
void graph_destroy(int device, void* exec);
}  // namespace cuda_mem
#define SIEVE_CUDA_OR_THROW(expr) expr
#else
#define SIEVE_CUDA_OR_THROW(expr) throw Error("this build has no CUDA backend")
#endif

Buffer::Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    size_t rounded = (bytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (!data_) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    std::memset(data_, 0, bytes);
  } else {
    SIEVE_CUDA_OR_THROW(data_ = cuda_mem::alloc(device.index, bytes));
    SIEVE_CUDA_OR_THROW(cuda_mem::fill(device.index, data_, 0, bytes));
  }
}

Buffer Buffer::view_of(const Buffer& parent, size_t offset, size_t bytes) {
  if (offset + bytes > parent.bytes_)
    throw Error("Buffer::view_of: bytes " + std::to_string(offset) + ".." + std::to_string(offset + bytes) +
                " outside a buffer of " + std::to_string(parent.bytes_));
  Buffer v;
  v.device_ = parent.device_;
  v.data_ = static_cast<uint8_t*>(parent.data_) + offset;
  v.bytes_ = bytes;
  v.owned_ = false;
  return v;
}

void Buffer::release() {
  if (!data_) return;
  if (owned_ && device_.is_cpu()) {
    std::free(data_);
  } else if (owned_) {
#ifdef SIEVE_HAVE_CUDA
    cuda_mem::free(device_.index, data_);
#endif
  }
  data_ = nullptr;
  bytes_ = 0;
  owned_ = true;
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& o) noexcept : device_(o.device_), data_(o.data_), bytes_(o.bytes_), owned_(o.owned_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
  o.owned_ = true;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    owned_ = o.owned_;
    o.data_ = nullptr;
    o.bytes_ = 0;
    o.owned_ = true;
  }
  return *this;
}

void copy_to_device(const Device& device, void* dst, const void* src, size_t bytes) {
  if (device.is_cpu()) {
    if (bytes) std::memcpy(dst, src, bytes);
  } else {
    SIEVE_CUDA_OR_THROW(cuda_mem::copy_h2d(device.index, dst, src, bytes));
  }
}

void* alloc_host(const Device& device, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (device.is_cpu()) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    return p;
  }
  void* p = nullptr;
  SIEVE_CUDA_OR_THROW(p = cuda_mem::alloc_host(device.index, bytes));
  return p;
}

void free_host(const Device& device, void* p) {
  if (!p) return;
  if (device.is_cpu()) return std::free(p);
#ifdef SIEVE_HAVE_CUDA
  cuda_mem::free_host(device.index, p);
#endif
}

void copy_to_host(const Device& device, void* dst, const void* src, size_t bytes) {
  if (device.is_cpu()) {
    if (bytes) std::memcpy(dst, src, bytes);
  } else {
    SIEVE_CUDA_OR_THROW(cuda_mem::copy_d2h(device.index, dst, src, bytes));
  }
}

void fill_bytes(const Device& device, void* dst, uint8_t value, size_t bytes) {
  if (device.is_cpu()) {
    if (bytes) std::memset(dst, value, bytes);
  } else {
    SIEVE_CUDA_OR_THROW(cuda_mem::fill(device.index, dst, value, bytes));
  }
}

void device_synchronize(const Device& device) {
  if (!device.is_cpu()) SIEVE_CUDA_OR_THROW(cuda_mem::sync(device.index));
}

void use_device(const Device& device) {
  if (!device.is_cpu()) SIEVE_CUDA_OR_THROW(cuda_mem::set_device(device.index));
}

void* create_stream(const Device& device) {
  if (device.is_cpu()) return nullptr;
  SIEVE_CUDA_OR_THROW(return cuda_mem::create_stream(device.index));
}

void destroy_stream(const Device& device, void* stream) {
#ifdef SIEVE_HAVE_CUDA
  if (!device.is_cpu() && stream) cuda_mem::destroy_stream(device.index, stream);
#else
  (void)device, (void)stream;
#endif
}

SideStream::SideStream(const Device& device) : device_(device) {
  if (device.is_cpu()) return;
  SIEVE_CUDA_OR_THROW(cuda_mem::create_side_stream(device.index, &stream_, &forked_, &joined_));
}

SideStream::~SideStream() { release(); }

SideStream::SideStream(SideStream&& o) noexcept
    : device_(o.device_), stream_(o.stream_), forked_(o.forked_), joined_(o.joined_) {
  o.stream_ = o.forked_ = o.joined_ = nullptr;
}

SideStream& SideStream::operator=(SideStream&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    stream_ = o.stream_, forked_ = o.forked_, joined_ = o.joined_;
    o.stream_ = o.forked_ = o.joined_ = nullptr;
  }
  return *this;
}

void SideStream::release() {
#ifdef SIEVE_HAVE_CUDA
  if (stream_) cuda_mem::destroy_side_stream(device_.index, stream_, forked_, joined_);
#endif
  stream_ = forked_ = joined_ = nullptr;
}

void SideStream::fork(void* main) const {
#ifdef SIEVE_HAVE_CUDA
  if (stream_) cuda_mem::stream_wait(main, stream_, forked_);
#else
  (void)main;
#endif
}

void SideStream::join(void* main) const {
#ifdef SIEVE_HAVE_CUDA
  if (stream_) cuda_mem::stream_wait(stream_, main, joined_);
#else
  (void)main;
#endif
}

Graph::~Graph() { release(); }

Graph::Graph(Graph&& o) noexcept : device_(o.device_), exec_(o.exec_) { o.exec_ = nullptr; }

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    exec_ = o.exec_;
    o.exec_ = nullptr;
  }
  return *this;
}

void Graph::release() {
#ifdef SIEVE_HAVE_CUDA
  if (exec_) cuda_mem::graph_destroy(device_.index, exec_);
#endif
  exec_ = nullptr;
}

void Graph::replay(void* stream) const {
  if (!exec_) throw Error("replay of an empty graph");
  SIEVE_CUDA_OR_THROW(cuda_mem::graph_replay(device_.index, exec_, stream));
}

Graph Graph::capture(const Device& device, void* stream, const std::function<void()>& fn, std::string* why) {
  Graph g;
  std::string reason;
  if (device.is_cpu()) {
    reason = "graphs are a CUDA feature";
  } else {
#ifdef SIEVE_HAVE_CUDA
    g.device_ = device;
    g.exec_ = cuda_mem::graph_capture(device.index, stream, fn, &reason);
#else
    (void)stream, (void)fn;
    reason = "this build has no CUDA backend";
#endif
  }
  if (!g.exec_ && why) *why = reason;
  return g;
}

int cuda_device_count() {
#ifdef SIEVE_HAVE_CUDA
  return cuda_mem::device_count();
#else
  return 0;
#endif
}

}  // namespace sieve
