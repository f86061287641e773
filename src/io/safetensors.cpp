#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/tensor.h"

namespace sieve {

namespace {

using nlohmann::json;

// A header larger than this is certainly corrupt (M3's largest shard header is ~100 kB); the
// bound keeps a garbage length from turning into a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

std::string errno_str() {
  return std::strerror(errno);
}

std::string kind_of(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

// A non-negative JSON integer (nlohmann parses those as unsigned).
bool as_u64(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = uint64_t(v.get<int64_t>());
    return true;
  }
  return false;
}

std::string read_small_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open (" + errno_str() + ")");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_ && map_ != MAP_FAILED) munmap(map_, map_size_);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open (" + errno_str() + ")");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    std::string e = errno_str();
    ::close(fd);
    throw Error(path + ": cannot stat (" + e + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw Error(path + ": file is " + std::to_string(file_size) +
                " bytes, too short for a safetensors file (expected an 8-byte header length "
                "followed by a JSON header)");
  }
  void* map = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string map_err = map == MAP_FAILED ? errno_str() : "";
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) throw Error(path + ": mmap failed (" + map_err + ")");
  f->map_ = map;
  f->map_size_ = file_size;
  const uint8_t* base = static_cast<const uint8_t*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little endian
  if (header_len > kMaxHeaderBytes)
    throw Error(path + ": header length " + std::to_string(header_len) +
                " is absurd (expected at most " + std::to_string(kMaxHeaderBytes) +
                " bytes); not a safetensors file or corrupted");
  if (header_len > file_size - 8)
    throw Error(path + ": header length " + std::to_string(header_len) + " exceeds the file (" +
                std::to_string(file_size) + " bytes); the file is truncated or corrupted");
  if (header_len < 2)
    throw Error(path + ": header length " + std::to_string(header_len) +
                " is too small for a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8),
                         reinterpret_cast<const char*>(base + 8 + header_len));
  } catch (const json::exception& e) {
    throw Error(path + ": header is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!header.is_object())
    throw Error(path + ": header is " + kind_of(header) + ", expected a JSON object");

  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (e.is_null()) continue;
      if (!e.is_object())
        throw Error(path + ": __metadata__ is " + kind_of(e) + ", expected an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string())
          throw Error(path + ": __metadata__[\"" + m.key() + "\"] is " + kind_of(m.value()) +
                      ", expected a string");
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor \"" + name + "\"";
    if (!e.is_object()) throw Error(where + " is " + kind_of(e) + ", expected an object");
    if (!e.contains("dtype") || !e["dtype"].is_string())
      throw Error(where + ": missing or non-string \"dtype\"");
    if (!e.contains("shape") || !e["shape"].is_array())
      throw Error(where + ": missing \"shape\" (expected a list of non-negative integers)");
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2)
      throw Error(where + ": missing \"data_offsets\" (expected [begin, end])");

    TensorInfo info;
    info.name = name;
    info.file = path;
    info.dtype = dtype_from_name(e["dtype"].get<std::string>(), where);

    // Element count, overflow-checked: a corrupt shape must not wrap around to a small size.
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : e["shape"]) {
      uint64_t v = 0;
      if (!as_u64(d, v))
        throw Error(where + ": shape " + e["shape"].dump() +
                    " has a non-integer or negative entry (expected non-negative integers)");
      if (v > uint64_t(INT64_MAX)) overflow = true;
      info.shape.push_back(int64_t(v));
      if (!overflow && __builtin_mul_overflow(numel, v, &numel)) overflow = true;
    }
    uint64_t nbytes = 0;
    if (overflow || __builtin_mul_overflow(numel, uint64_t(dtype_size(info.dtype)), &nbytes))
      throw Error(where + ": shape " + e["shape"].dump() + " is too large (size overflows)");

    uint64_t begin = 0, end = 0;
    if (!as_u64(e["data_offsets"][0], begin) || !as_u64(e["data_offsets"][1], end))
      throw Error(where + ": data_offsets " + e["data_offsets"].dump() +
                  " are not non-negative integers");
    if (begin > end)
      throw Error(where + ": data_offsets " + e["data_offsets"].dump() + " have begin > end");
    if (end > data_size)
      throw Error(where + ": data_offsets " + e["data_offsets"].dump() +
                  " lie outside the data section (" + std::to_string(data_size) +
                  " bytes); the file is truncated or corrupted");
    if (end - begin != nbytes)
      throw Error(where + ": data_offsets " + e["data_offsets"].dump() + " span " +
                  std::to_string(end - begin) + " bytes, expected " + std::to_string(nbytes) +
                  " (" + std::string(dtype_name(info.dtype)) + " x shape " + e["shape"].dump() +
                  ")");
    info.data = base + data_start + begin;
    info.nbytes = size_t(nbytes);
    auto [pos, inserted] = f->tensors_.emplace(name, std::move(info));
    if (nbytes > 0) spans.push_back({begin, end, &pos->first});
  }

  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end)
      throw Error(path + ": tensors \"" + *spans[i - 1].name + "\" and \"" + *spans[i].name +
                  "\" overlap in the data section (bytes " + std::to_string(spans[i - 1].begin) +
                  ".." + std::to_string(spans[i - 1].end) + " and " +
                  std::to_string(spans[i].begin) + ".." + std::to_string(spans[i].end) + ")");
  }
  return f;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint ck;
  ck.dir_ = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error("model directory " + dir + " does not exist or is not a directory");

  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    json index;
    try {
      index = json::parse(read_small_file(index_path));
    } catch (const json::exception& e) {
      throw Error(index_path + ": invalid JSON (" + std::string(e.what()) + ")");
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(index_path + ": expected an object with a \"weight_map\" object");
    const json& wm = index["weight_map"];
    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      if (!it.value().is_string())
        throw Error(index_path + ": weight_map[\"" + it.key() + "\"] is " + kind_of(it.value()) +
                    ", expected a shard file name");
      std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard[0] == '/' || shard.find("..") != std::string::npos)
        throw Error(index_path + ": weight_map[\"" + it.key() + "\"] = \"" + shard +
                    "\" is not a file name inside " + dir);
      if (!shards.count(shard)) {
        std::string shard_path = dir + "/" + shard;
        if (!fs::exists(shard_path, ec))
          throw Error(index_path + ": names shard \"" + shard + "\" (for tensor \"" + it.key() +
                      "\"), but " + shard_path + " does not exist");
        auto file = std::shared_ptr<SafetensorsFile>(SafetensorsFile::open(shard_path));
        ck.files_.push_back(file);
        shards[shard] = file;
      }
      const auto& ts = shards[shard]->tensors();
      auto t = ts.find(it.key());
      if (t == ts.end())
        throw Error(index_path + ": tensor \"" + it.key() + "\" is listed in shard \"" + shard +
                    "\", but " + dir + "/" + shard + " does not contain it");
      ck.tensors_[it.key()] = t->second;
    }
    return ck;
  }

  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  }
  if (ec) throw Error("cannot list model directory " + dir + " (" + ec.message() + ")");
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw Error("model directory " + dir +
                " has no *.safetensors files (and no model.safetensors.index.json)");
  for (const auto& p : files) {
    auto file = std::shared_ptr<SafetensorsFile>(SafetensorsFile::open(p));
    ck.files_.push_back(file);
    for (const auto& [name, info] : file->tensors()) {
      auto [it, inserted] = ck.tensors_.emplace(name, info);
      if (!inserted)
        throw Error("tensor \"" + name + "\" appears in both " + it->second.file + " and " + p +
                    " (and " + dir + " has no model.safetensors.index.json to choose)");
    }
  }
  return ck;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error("tensor " + name + " not found in " + dir_);
  return it->second;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Data goes widest element type first (then by name), so every tensor starts aligned to its
  // element size with no gaps; the header lists tensors by name (nlohmann objects are sorted).
  std::vector<const TensorToWrite*> order;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || t.name.empty())
      throw Error(path + ": invalid tensor name \"" + t.name + "\"");
    if (!names.insert(t.name).second) throw Error(path + ": tensor \"" + t.name + "\" given twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw Error(path + ": tensor \"" + t.name + "\" has a negative dimension");
      numel *= uint64_t(d);
    }
    if (numel * dtype_size(t.dtype) != t.bytes.size())
      throw Error(path + ": tensor \"" + t.name + "\" has " + std::to_string(t.bytes.size()) +
                  " bytes, expected " + std::to_string(numel * dtype_size(t.dtype)) + " (" +
                  std::string(dtype_name(t.dtype)) + " x " + shape_str(t.shape) + ")");
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  json header = json::object();
  uint64_t offset = 0;
  for (const TensorToWrite* t : order) {
    header[t->name] = {{"dtype", std::string(dtype_name(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
  }
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path + ": cannot create (" + errno_str() + ")");
  uint8_t len[8];
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (const TensorToWrite* t : order)
    out.write(reinterpret_cast<const char*>(t->bytes.data()), std::streamsize(t->bytes.size()));
  out.flush();
  if (!out) throw Error(path + ": write failed (" + errno_str() + ")");
}

}  // namespace sieve
