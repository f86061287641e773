#include "cache/sizing.h"

#include <cctype>
#include <cmath>

#include "core/error.h"

namespace sieve::cache {

uint64_t parse_bytes(const std::string& text, const std::string& flag) {
  auto bad = [&]() -> Error {
    return Error(flag + ": expected a size in bytes such as 536870912, 512MiB or 4G, got '" + text +
                 "'");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) throw bad();
  double value = 0;
  try {
    value = std::stod(text.substr(0, i));
  } catch (...) {
    throw bad();
  }
  std::string unit = text.substr(i);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (unit.size() == 2 && unit[1] == 'I') unit.pop_back();
  double mult = 1;
  if (unit.empty())
    mult = 1;
  else if (unit == "K")
    mult = 1024.0;
  else if (unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    throw bad();
  double bytes = value * mult;
  if (!std::isfinite(bytes) || bytes < 1 || bytes > 1.8e19) throw bad();
  return uint64_t(bytes);
}

int64_t blocks_for_bytes(uint64_t bytes, size_t bytes_per_block, const std::string& what) {
  SIEVE_CHECK(bytes_per_block > 0, "zero bytes per cache block");
  uint64_t n = bytes / bytes_per_block;
  if (n < 1)
    throw Error(what + ": " + std::to_string(bytes) +
                " bytes hold no cache block (one block takes " + std::to_string(bytes_per_block) +
                " bytes)");
  if (n > (uint64_t(1) << 30)) n = uint64_t(1) << 30;
  return int64_t(n);
}

int64_t blocks_for_gpu(size_t total_bytes, size_t free_bytes, double utilization,
                       size_t bytes_per_block) {
  if (!(utilization > 0.0 && utilization <= 1.0))
    throw Error("--gpu-memory-utilization must be in (0, 1], got " + std::to_string(utilization));
  const double budget = double(total_bytes) * utilization;
  const double used = double(total_bytes) - double(free_bytes);
  const double avail = budget - used;
  if (avail < double(bytes_per_block))
    throw Error("--gpu-memory-utilization " + std::to_string(utilization) +
                " leaves no memory for the KV cache (" + std::to_string(size_t(used)) + " of " +
                std::to_string(total_bytes) + " bytes already in use); raise it");
  return blocks_for_bytes(uint64_t(avail), bytes_per_block, "--gpu-memory-utilization");
}

void check_block_size(int block_size, int model_block_size, bool sparse_model) {
  if (block_size <= 0)
    throw Error("--block-size must be positive, got " + std::to_string(block_size));
  if (sparse_model && block_size != model_block_size)
    throw Error("--block-size " + std::to_string(block_size) +
                " is not supported: this model's sparse attention " + "selects blocks of " +
                std::to_string(model_block_size) +
                " tokens and one cache page must be one sparse block; use --block-size " +
                std::to_string(model_block_size));
  if (block_size != model_block_size)
    throw Error("--block-size " + std::to_string(block_size) +
                " is not supported: this engine pages the cache in blocks of " +
                std::to_string(model_block_size) + " tokens");
}

}  // namespace sieve::cache
