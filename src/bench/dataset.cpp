#include "bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/jsonl.h"

namespace sieve::bench {

RangeMode parse_range_mode(const std::string& s) {
  if (s == "vllm") return RangeMode::vllm;
  if (s == "atom") return RangeMode::atom;
  throw Error("--range-ratio-mode must be atom or vllm, got \"" + s + "\"");
}

namespace {
// vLLM requires r in [0, 1); ATOM's rule also takes r = 1 (fixed lengths).
void check_ratio(double r, RangeMode mode) {
  bool ok = mode == RangeMode::atom ? (r >= 0.0 && r <= 1.0) : (r >= 0.0 && r < 1.0);
  if (!ok)
    throw Error(std::string("--random-range-ratio must be in ") +
                (mode == RangeMode::atom ? "[0, 1]" : "[0, 1)") + ", got " + std::to_string(r));
}
}  // namespace

LengthRange input_length_range(int len, double r, RangeMode mode) {
  check_ratio(r, mode);
  LengthRange g;
  if (mode == RangeMode::atom) {
    g = {int(len * r), len};
  } else {
    g = {int(std::floor(len * (1.0 - r))), int(std::ceil(len * (1.0 + r)))};
  }
  g.lo = std::max(g.lo, 1);
  g.hi = std::max(g.hi, g.lo);
  return g;
}

LengthRange output_length_range(int len, double r, RangeMode mode) {
  LengthRange g = input_length_range(len, r, mode);
  return g;  // both rules already clamp the low end to 1 token
}

std::vector<SampleRequest> random_dataset(const RandomConfig& c, const TextCodec* tok) {
  if (c.input_len < 1 || c.output_len < 1)
    throw Error("--random-input-len and --random-output-len must be at least 1");
  if (c.prefix_len < 0) throw Error("--random-prefix-len must be >= 0");
  int vocab = tok ? tok->vocab_size() : c.vocab_size;
  if (vocab < 1) throw Error("--random-vocab-size must be at least 1");
  std::mt19937_64 rng(c.seed);
  LengthRange in = input_length_range(c.input_len, c.range_ratio, c.mode);
  LengthRange out = output_length_range(c.output_len, c.range_ratio, c.mode);
  std::uniform_int_distribution<int> in_d(in.lo, in.hi), out_d(out.lo, out.hi), tok_d(0, vocab - 1);
  std::vector<int> prefix(size_t(c.prefix_len));
  for (int& t : prefix) t = tok_d(rng);
  std::vector<SampleRequest> reqs;
  reqs.reserve(size_t(c.num_prompts));
  for (int i = 0; i < c.num_prompts; ++i) {
    SampleRequest r;
    int n = in_d(rng);
    r.output_len = out_d(rng);
    std::vector<int> ids = prefix;
    for (int k = 0; k < n; ++k) ids.push_back(tok_d(rng));
    if (tok) {
      // Decoding random ids and encoding again rarely gives the same ids; keep the text and
      // report the length the server will see, cut back to the target when it grew.
      int target = int(ids.size());
      std::vector<int> cur = ids, again;
      for (int attempt = 0; attempt < 16; ++attempt) {
        r.text = tok->decode(cur);
        again = tok->encode(r.text);
        if (int(again.size()) <= target) break;
        cur = again;
        cur.resize(size_t(std::max(1, target - attempt)));
      }
      if (int(again.size()) > target) {
        // Still too long (decode/encode keeps growing): keep the longest text prefix, cut on a
        // UTF-8 boundary, that encodes to at most `target` tokens.
        size_t lo = 0, hi = r.text.size();
        while (lo < hi) {
          size_t mid = (lo + hi + 1) / 2;
          while (mid > 0 && mid < r.text.size() &&
                 (static_cast<unsigned char>(r.text[mid]) & 0xC0) == 0x80)
            --mid;
          if (mid <= lo) break;
          if (int(tok->encode(r.text.substr(0, mid)).size()) <= target)
            lo = mid;
          else
            hi = mid - 1;
        }
        r.text.resize(lo);
        again = tok->encode(r.text);
      }
      r.prompt_len = int(again.size());
    } else {
      r.use_ids = true;
      r.token_ids = std::move(ids);
      r.prompt_len = int(r.token_ids.size());
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

namespace {

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> rows;
  io::for_each_jsonl(path, "dataset file", [&](const nlohmann::json& j, const std::string& where) {
    if (!j.is_object()) throw Error(where + ": not a JSON object");
    rows.push_back(j);
  });
  if (rows.empty()) throw Error("dataset file " + path + " has no rows");
  return rows;
}

std::vector<size_t> pick(size_t rows, int num_prompts, uint64_t seed) {
  std::vector<size_t> order(rows);
  for (size_t i = 0; i < rows; ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<size_t> out;
  for (int i = 0; i < num_prompts; ++i) out.push_back(order[size_t(i) % rows]);
  return out;
}

void set_text(SampleRequest& r, std::string text, const TextCodec* tok) {
  r.text = std::move(text);
  r.prompt_len = tok ? int(tok->encode(r.text).size()) : 0;
}

}  // namespace

std::vector<SampleRequest> gsm8k_dataset(const std::string& path, int num_prompts, int output_len,
                                         uint64_t seed, const TextCodec* tok) {
  auto rows = read_jsonl(path);
  std::vector<SampleRequest> reqs;
  for (size_t i : pick(rows.size(), num_prompts, seed)) {
    const auto& row = rows[i];
    if (!row.contains("question") || !row["question"].is_string())
      throw Error(path + ": row " + std::to_string(i + 1) + " has no \"question\" string");
    SampleRequest r;
    set_text(r, "Question: " + row["question"].get<std::string>() + "\nAnswer:", tok);
    r.output_len = output_len;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

std::vector<SampleRequest> jsonl_dataset(const std::string& path, int num_prompts, int output_len,
                                         uint64_t seed, const TextCodec* tok) {
  auto rows = read_jsonl(path);
  std::vector<SampleRequest> reqs;
  for (size_t i : pick(rows.size(), num_prompts, seed)) {
    const auto& row = rows[i];
    SampleRequest r;
    auto p = row.find("prompt");
    if (p == row.end()) throw Error(path + ": row " + std::to_string(i + 1) + " has no \"prompt\"");
    if (p->is_string()) {
      set_text(r, p->get<std::string>(), tok);
    } else if (p->is_array()) {
      r.use_ids = true;
      for (const auto& t : *p) {
        if (!t.is_number_integer())
          throw Error(path + ": row " + std::to_string(i + 1) + ": \"prompt\" must hold token ids");
        r.token_ids.push_back(t.get<int>());
      }
      r.prompt_len = int(r.token_ids.size());
    } else {
      throw Error(path + ": row " + std::to_string(i + 1) +
                  ": \"prompt\" must be text or token ids");
    }
    r.output_len = output_len;
    for (const char* k : {"output_len", "max_tokens"})
      if (row.contains(k) && row[k].is_number_integer()) r.output_len = row[k].get<int>();
    reqs.push_back(std::move(r));
  }
  return reqs;
}

}  // namespace sieve::bench
