#include "spec/config.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sieve::spec {

namespace fs = std::filesystem;

const char* method_name(Method m) {
  switch (m) {
    case Method::Ngram:
      return "ngram";
    case Method::Eagle3:
      return "eagle3";
    default:
      return "none";
  }
}

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error("--speculative-config: " + what);
}

int get_int(const nlohmann::json& j, const char* key, int lo, int hi) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer()) fail(std::string(key) + " must be an integer, got " + v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    fail(std::string(key) + " must be in " + std::to_string(lo) + ".." + std::to_string(hi) +
         ", got " + std::to_string(x));
  return int(x);
}

}  // namespace

SpeculativeConfig parse_speculative_config(const std::string& arg, bool draft_optional) {
  SpeculativeConfig c;
  if (arg.empty()) return c;
  // A file of JSON (so that `make serve ARGS=...` needs no shell quoting): its "model" is
  // relative to the file's folder.
  std::string text = arg, base;
  const size_t first = arg.find_first_not_of(" \t\n");
  if (first != std::string::npos && arg[first] != '{' && arg[first] != '[' &&
      fs::is_regular_file(arg)) {
    std::ifstream in(arg);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    base = fs::path(arg).parent_path().string();
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(
        std::string("not valid JSON (") + e.what() + ")" +
        (base.empty() && first != std::string::npos && arg[first] != '{' ? " and not a file" : ""));
  }
  if (!j.is_object())
    fail("expected a JSON object such as {\"method\": \"ngram\", \"num_speculative_tokens\": 3}");
  static const char* known[] = {"method",
                                "model",
                                "num_speculative_tokens",
                                "prompt_lookup_min",
                                "prompt_lookup_max",
                                "disable_by_batch_size",
                                "draft_tensor_parallel_size"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) fail("unknown field \"" + it.key() + "\"");
  }
  if (!j.contains("method") || !j["method"].is_string())
    fail("method is required: \"ngram\" or \"eagle3\"");
  const std::string m = j["method"].get<std::string>();
  if (m == "ngram")
    c.method = Method::Ngram;
  else if (m == "eagle3")
    c.method = Method::Eagle3;
  else
    fail("unknown method \"" + m + "\" (supported: \"ngram\", \"eagle3\")");
  if (!j.contains("num_speculative_tokens")) fail("num_speculative_tokens is required");
  c.num_speculative_tokens = get_int(j, "num_speculative_tokens", 1, kMaxSpeculativeTokens);
  if (j.contains("disable_by_batch_size"))
    c.disable_by_batch_size = get_int(j, "disable_by_batch_size", 1, 1 << 20);
  if (j.contains("draft_tensor_parallel_size")) get_int(j, "draft_tensor_parallel_size", 1, 1);
  if (c.method == Method::Eagle3) {
    if (j.contains("model") || !draft_optional) {
      if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty())
        fail("method \"eagle3\" needs \"model\": the draft's directory");
      c.model = j["model"].get<std::string>();
    }
    if (!c.model.empty() && !base.empty() && fs::path(c.model).is_relative()) {
      fs::path m = (fs::path(base) / c.model).lexically_normal();
      if (m.filename().empty()) m = m.parent_path();  // "dir/." -> "dir"
      c.model = m.string();
    }
    for (const char* k : {"prompt_lookup_min", "prompt_lookup_max"})
      if (j.contains(k)) fail(std::string(k) + " applies to method \"ngram\" only");
  } else {
    if (j.contains("model")) fail("method \"ngram\" takes no \"model\"");
    const bool has_min = j.contains("prompt_lookup_min"), has_max = j.contains("prompt_lookup_max");
    c.prompt_lookup_min = has_min ? get_int(j, "prompt_lookup_min", 1, 1 << 16) : 0;
    c.prompt_lookup_max = has_max ? get_int(j, "prompt_lookup_max", 1, 1 << 16) : 0;
    if (!has_min && !has_max) c.prompt_lookup_min = c.prompt_lookup_max = 5;
    if (!has_min) c.prompt_lookup_min = c.prompt_lookup_max;
    if (!has_max) c.prompt_lookup_max = c.prompt_lookup_min;
    if (c.prompt_lookup_min > c.prompt_lookup_max)
      fail("prompt_lookup_min (" + std::to_string(c.prompt_lookup_min) +
           ") is larger than prompt_lookup_max (" + std::to_string(c.prompt_lookup_max) + ")");
  }
  return c;
}

}  // namespace sieve::spec
