// safetensors reader and writer: round trips of every dtype, sharded checkpoints, and corrupted
// files that must give an Error naming the file, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fresh_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "/sieve_st_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

TensorToWrite random_tensor(std::mt19937& rng, const std::string& name, DType dt,
                            std::vector<int64_t> shape) {
  size_t n = dtype_size(dt);
  for (int64_t d : shape) n *= size_t(d);
  return {name, dt, shape, random_bytes(rng, n)};
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void write_all(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// A file from a raw header string and data bytes (header length as given).
void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& data,
               uint64_t header_len) {
  std::vector<uint8_t> b(8);
  for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(header_len >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  write_all(path, b);
}
void write_raw(const std::string& path, const std::string& header,
               const std::vector<uint8_t>& data) {
  write_raw(path, header, data, header.size());
}

template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-Error exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

const std::vector<DType> kAllDtypes = {DType::BF16, DType::F16, DType::F32, DType::FP8_E4M3,
                                       DType::U8,   DType::I32, DType::I64};

TEST(Safetensors, RoundTripEveryDtype) {
  std::mt19937 rng(std::random_device{}());
  std::string dir = fresh_dir("roundtrip");
  std::vector<TensorToWrite> ts;
  int k = 0;
  for (DType dt : kAllDtypes) {
    // Odd shapes so element sizes do not line up by accident; one scalar and one empty tensor.
    std::string name = std::to_string(k++);
    name.insert(0, 1, 't');
    name.append(".").append(dtype_name(dt));
    ts.push_back(random_tensor(rng, name, dt, {int64_t(1 + rng() % 7), int64_t(1 + rng() % 13)}));
  }
  ts.push_back(random_tensor(rng, "scalar", DType::F32, {}));
  ts.push_back(random_tensor(rng, "empty", DType::BF16, {0, 5}));
  ts.push_back(random_tensor(rng, "a.first_by_name", DType::U8, {3}));
  std::string path = dir + "/model.safetensors";
  write_safetensors(path, ts, {{"format", "pt"}, {"note", "sieve test"}});

  // The header is padded to 8 bytes and lists names in sorted order.
  auto raw = read_all(path);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = (hl << 8) | raw[size_t(i)];
  EXPECT_EQ(hl % 8, 0u);

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "sieve test");
  ASSERT_EQ(f->tensors().size(), ts.size());
  for (const auto& t : ts) {
    const TensorInfo& info = f->tensors().at(t.name);
    EXPECT_EQ(info.name, t.name);
    EXPECT_EQ(info.dtype, t.dtype);
    EXPECT_EQ(info.shape, t.shape);
    EXPECT_EQ(info.nbytes, t.bytes.size());
    EXPECT_EQ(info.file, path);
    if (!t.bytes.empty()) {
      EXPECT_EQ(std::memcmp(info.data, t.bytes.data(), t.bytes.size()), 0) << t.name;
      // Each tensor starts aligned to its element size.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(info.data) % dtype_size(t.dtype), 0u) << t.name;
    }
  }
  // Checkpoint over a directory without an index picks up the file.
  Checkpoint ck = Checkpoint::open(dir);
  EXPECT_EQ(ck.tensors().size(), ts.size());
  EXPECT_TRUE(ck.has("scalar"));
  EXPECT_EQ(ck.get("t2.F32").dtype, DType::F32);
  std::string msg = error_of([&] { ck.get("nope.weight"); });
  EXPECT_NE(msg.find("nope.weight"), std::string::npos);
  EXPECT_NE(msg.find(dir), std::string::npos);
}

TEST(Safetensors, ShardedWithIndex) {
  std::mt19937 rng(std::random_device{}());
  std::string dir = fresh_dir("sharded");
  std::vector<TensorToWrite> a = {random_tensor(rng, "x.weight", DType::BF16, {4, 6}),
                                  random_tensor(rng, "y.weight", DType::F32, {3})};
  std::vector<TensorToWrite> b = {random_tensor(rng, "z.weight", DType::FP8_E4M3, {2, 32}),
                                  random_tensor(rng, "z.weight_scale_inv", DType::U8, {2, 1})};
  write_safetensors(dir + "/model-00001-of-00002.safetensors", a);
  write_safetensors(dir + "/model-00002-of-00002.safetensors", b);
  // A stray file that the index does not name must be ignored.
  write_safetensors(dir + "/stray.safetensors", {random_tensor(rng, "x.weight", DType::F32, {1})});
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (const auto& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);

  Checkpoint ck = Checkpoint::open(dir);
  EXPECT_EQ(ck.tensors().size(), 4u);
  for (const auto* group : {&a, &b})
    for (const auto& t : *group) {
      const TensorInfo& info = ck.get(t.name);
      EXPECT_EQ(info.shape, t.shape);
      EXPECT_EQ(info.dtype, t.dtype);
      ASSERT_EQ(info.nbytes, t.bytes.size());
      EXPECT_EQ(std::memcmp(info.data, t.bytes.data(), t.bytes.size()), 0);
    }
  EXPECT_NE(ck.get("z.weight").file.find("00002"), std::string::npos);
  EXPECT_EQ(ck.get("x.weight").dtype, DType::BF16);  // from the shard, not the stray file

  // Copies share the mappings.
  Checkpoint copy = ck;
  EXPECT_EQ(copy.get("y.weight").data, ck.get("y.weight").data);

  // Index naming a missing shard.
  index["weight_map"]["w.weight"] = "model-00003-of-00002.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  std::string msg = error_of([&] { Checkpoint::open(dir); });
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model-00003-of-00002.safetensors"), std::string::npos) << msg;
  // Index naming a tensor its shard does not have.
  index["weight_map"]["w.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  msg = error_of([&] { Checkpoint::open(dir); });
  EXPECT_NE(msg.find("w.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model-00001-of-00002.safetensors"), std::string::npos) << msg;
  // Index that is not JSON / has no weight_map.
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"weight_map\": {";
  msg = error_of([&] { Checkpoint::open(dir); });
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"metadata\": {}}";
  msg = error_of([&] { Checkpoint::open(dir); });
  EXPECT_NE(msg.find("weight_map"), std::string::npos) << msg;
}

TEST(Safetensors, DirectoryErrors) {
  std::string missing = ::testing::TempDir() + "/sieve_st_no_such_dir";
  std::string msg = error_of([&] { Checkpoint::open(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  std::string empty = fresh_dir("emptydir");
  msg = error_of([&] { Checkpoint::open(empty); });
  EXPECT_NE(msg.find("no *.safetensors"), std::string::npos) << msg;
  // Two unindexed files with the same tensor.
  std::mt19937 rng(std::random_device{}());
  write_safetensors(empty + "/a.safetensors", {random_tensor(rng, "w", DType::F32, {2})});
  write_safetensors(empty + "/b.safetensors", {random_tensor(rng, "w", DType::F32, {2})});
  msg = error_of([&] { Checkpoint::open(empty); });
  EXPECT_NE(msg.find("\"w\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("a.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("b.safetensors"), std::string::npos) << msg;
}

TEST(Safetensors, WriterRejectsBadInput) {
  std::string dir = fresh_dir("writer");
  std::string msg = error_of([&] {
    write_safetensors(dir + "/a.safetensors",
                      {{"w", DType::F32, {2, 3}, std::vector<uint8_t>(20)}});
  });
  EXPECT_NE(msg.find("\"w\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("24"), std::string::npos) << msg;
  msg = error_of([&] {
    write_safetensors(dir + "/a.safetensors",
                      {{"w", DType::U8, {1}, {1}}, {"w", DType::U8, {1}, {2}}});
  });
  EXPECT_NE(msg.find("twice"), std::string::npos) << msg;
  msg = error_of([&] { write_safetensors(dir + "/no/such/dir/a.safetensors", {}); });
  EXPECT_NE(msg.find("no/such/dir/a.safetensors"), std::string::npos) << msg;
}

// Each corrupted file: an Error whose message starts with the path and contains `expect`.
struct Corrupt {
  std::string what;
  std::string header;
  size_t data_bytes;
  std::string expect;
};

TEST(Safetensors, CorruptedHeadersGiveErrorsNamingTheFile) {
  std::string dir = fresh_dir("corrupt");
  std::vector<Corrupt> cases = {
      {"bad JSON", R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})", 8,
       "not valid JSON"},
      {"not an object", R"([1, 2, 3])", 0, "expected a JSON object"},
      {"unknown dtype", R"({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})", 16,
       "F64"},
      {"offsets out of range", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
       8, "outside the data section"},
      {"size != dtype x shape", R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
       8, "expected 12"},
      {"overlap",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, "overlap"},
      {"begin > end", R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [8, 4]}})", 8,
       "begin > end"},
      {"negative dim", R"({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}})", 0,
       "non-negative"},
      {"float dim", R"({"w": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 1]}})", 1,
       "non-negative"},
      {"shape overflow",
       R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0,
       "overflow"},
      {"shape overflow to zero bytes",
       R"({"w": {"dtype": "U8", "shape": [18446744073709551615, 2], "data_offsets": [0, 0]}})", 0,
       "overflow"},
      {"missing dtype", R"({"w": {"shape": [2], "data_offsets": [0, 2]}})", 2, "dtype"},
      {"missing shape", R"({"w": {"dtype": "U8", "data_offsets": [0, 2]}})", 2, "shape"},
      {"missing offsets", R"({"w": {"dtype": "U8", "shape": [2]}})", 2, "data_offsets"},
      {"three offsets", R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 1, 2]}})", 2,
       "data_offsets"},
      {"negative offset", R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [-2, 0]}})", 2,
       "data_offsets"},
      {"entry not an object", R"({"w": 5})", 0, "expected an object"},
      {"metadata not strings", R"({"__metadata__": {"a": 1}})", 0, "__metadata__"},
  };
  for (const auto& c : cases) {
    std::string path = dir + "/bad.safetensors";
    write_raw(path, c.header, std::vector<uint8_t>(c.data_bytes, 0));
    std::string msg = error_of([&] { SafetensorsFile::open(path); });
    EXPECT_EQ(msg.find(path), 0u) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    // Errors about one tensor name it.
    if (c.header.find("\"w\"") != std::string::npos && c.what != "bad JSON") {
      EXPECT_NE(msg.find("\"w\""), std::string::npos) << c.what << ": " << msg;
    }
  }
}

TEST(Safetensors, TruncatedFilesAndAbsurdLengths) {
  std::mt19937 rng(std::random_device{}());
  std::string dir = fresh_dir("trunc");
  std::string good = dir + "/good.safetensors";
  write_safetensors(good, {random_tensor(rng, "a", DType::BF16, {16, 8}),
                           random_tensor(rng, "b", DType::F32, {5})});
  auto bytes = read_all(good);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = (hl << 8) | bytes[size_t(i)];
  std::string bad = dir + "/bad.safetensors";

  struct Case {
    size_t keep;
    std::string expect;
  };
  std::vector<Case> cases = {{0, "too short"},
                             {5, "too short"},
                             {8, "exceeds the file"},
                             {8 + size_t(hl) / 2, "exceeds the file"},          // truncated header
                             {8 + size_t(hl) + 3, "outside the data section"},  // truncated data
                             {bytes.size() - 1, "outside the data section"}};
  for (const auto& c : cases) {
    write_all(bad, std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(c.keep)));
    std::string msg = error_of([&] { SafetensorsFile::open(bad); });
    EXPECT_EQ(msg.find(bad), 0u) << c.keep << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.keep << ": " << msg;
  }
  // Absurd header lengths.
  for (uint64_t len : {uint64_t(1) << 40, ~uint64_t(0), uint64_t(200) * 1000 * 1000}) {
    auto b = bytes;
    for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(len >> (8 * i));
    write_all(bad, b);
    std::string msg = error_of([&] { SafetensorsFile::open(bad); });
    EXPECT_EQ(msg.find(bad), 0u) << msg;
    EXPECT_NE(msg.find("absurd"), std::string::npos) << msg;
  }
  std::string msg = error_of([&] { SafetensorsFile::open(dir + "/absent.safetensors"); });
  EXPECT_NE(msg.find("absent.safetensors"), std::string::npos) << msg;
  msg = error_of([&] { SafetensorsFile::open(dir); });
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
}

// Flip, overwrite and truncate bytes of a valid file: every outcome is a successful open (with
// all tensors inside the mapping) or an Error naming the file.
TEST(Safetensors, RandomCorruptionNeverCrashes) {
  std::mt19937 rng(std::random_device{}());
  std::string dir = fresh_dir("fuzz");
  std::string good = dir + "/good.safetensors";
  std::vector<TensorToWrite> ts;
  for (int i = 0; i < 6; ++i)
    ts.push_back(random_tensor(rng, "layer." + std::to_string(i) + ".w",
                               kAllDtypes[size_t(i) % kAllDtypes.size()],
                               {int64_t(1 + rng() % 5), int64_t(1 + rng() % 9)}));
  write_safetensors(good, ts, {{"format", "pt"}});
  const auto bytes = read_all(good);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = (hl << 8) | bytes[size_t(i)];
  std::string bad = dir + "/bad.safetensors";
  int opened = 0, errors = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    auto b = bytes;
    int mode = int(rng() % 4);
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      // Aim most edits at the length and header, where the parser lives.
      size_t limit = (rng() % 4 == 0) ? b.size() : std::min(b.size(), size_t(8 + hl));
      if (limit == 0) break;
      size_t pos = rng() % limit;
      if (mode == 0)
        b[pos] ^= uint8_t(1u << (rng() % 8));
      else if (mode == 1)
        b[pos] = uint8_t(rng());
      else if (mode == 2)
        b[pos] = uint8_t("0123456789[]{},:\"-eE. "[rng() % 22]);
      else
        b.resize(pos);
    }
    write_all(bad, b);
    try {
      auto f = SafetensorsFile::open(bad);
      const uint8_t* lo = b.data();
      (void)lo;
      for (const auto& [name, info] : f->tensors()) {
        // Touch every byte: a wrong pointer would fault or read outside the file.
        uint32_t sum = 0;
        for (size_t i = 0; i < info.nbytes; ++i) sum += static_cast<const uint8_t*>(info.data)[i];
        (void)sum;
        ASSERT_LE(info.nbytes, b.size());
      }
      ++opened;
    } catch (const Error& e) {
      ASSERT_EQ(std::string(e.what()).find(bad), 0u) << e.what();
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);
  EXPECT_GT(opened, 0);  // flips inside tensor data are harmless
}

}  // namespace
}  // namespace sieve
