// safetensors files: mmap'd reader (single file, or sharded through model.safetensors.index.json)
// with a validated header, and a writer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sieve {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the mapping
  size_t nbytes = 0;
  std::string file;  // which file holds it
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// One mmap'd .safetensors file. The header is validated at open: JSON well formed, dtypes known
// (BF16, F16, F32, F8_E4M3, U8, I32, I64), data_offsets inside the file, byte sizes equal to
// dtype size x shape, no two tensors overlapping. Errors name the file and tensor.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: model.safetensors.index.json when present (each listed
// shard opened once; every tensor the index names must exist in its shard), else every
// *.safetensors file in the directory.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  // Throws Error "tensor NAME not found in DIR" when absent.
  const TensorInfo& get(const std::string& name) const;
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // dtype_size(dtype) * prod(shape)
};

// Writes one .safetensors file (tensors in name order, 8-byte aligned header).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace sieve
