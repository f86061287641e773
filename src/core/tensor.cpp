#include "core/tensor.h"

namespace sieve {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

TensorView::TensorView(void* d, DType t, std::vector<int64_t> s, Device dev)
    : data(d), dtype(t), shape(std::move(s)), device(dev) {
  strides.assign(shape.size(), 1);
  for (int64_t i = int64_t(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int64_t i = int64_t(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string TensorView::shape_str() const { return sieve::shape_str(shape); }

}  // namespace sieve
