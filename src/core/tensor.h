// A non-owning view of a strided array on one device. Kernels take raw pointers in their
// parameter structs (kernels/ops.h); views are what the layers above pass around and check.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sieve {

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements
  Device device;

  TensorView() = default;
  // Contiguous row-major view.
  TensorView(void* data, DType dtype, std::vector<int64_t> shape, Device device = {});

  int64_t dim() const { return int64_t(shape.size()); }
  int64_t size(int64_t d) const { return shape.at(d < 0 ? d + dim() : d); }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  std::string shape_str() const;  // "[2, 3, 4]"

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace sieve
