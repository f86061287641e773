#include "text/byte_level.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat_template.h"
#include "text/unicode.h"

namespace sieve::text {

namespace {

// GPT-2's printable stand-in for each byte (the same table the tokenizer decodes with).
std::string byte_char(int b) {
  int n = 0;
  for (int x = 0; x < 256; ++x) {
    bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    uint32_t cp = printable ? x : 256 + n++;
    if (x == b) {
      std::string s;
      append_utf8(s, cp);
      return s;
    }
  }
  return "";
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error("cannot write " + path);
  f << text;
  if (!f) throw Error("cannot write " + path);
}

}  // namespace

ByteLevelTokenizerInfo write_byte_level_tokenizer(const std::string& dir, int32_t vocab_size,
                                                  int max_merges) {
  // special: the MiniMax turn markers and namespace token are control tokens (the server keeps
  // the namespace token for its tool-call parser); the think markers stay visible in decoded
  // text, as the M2 tokenizer has <think>.
  const std::vector<std::pair<std::string, bool>> specials = {
      {"]~!b[", true},       {"]~b]", true},        {"[e~[", true},         {"]<]minimax[>[", true},
      {"<think>", false},    {"</think>", false},   {"<tool_call>", false}, {"</tool_call>", false},
      {"<mm:think>", false}, {"</mm:think>", false}};
  const int32_t needed = 256 + static_cast<int32_t>(specials.size());
  if (vocab_size < needed)
    throw Error("a byte-level tokenizer needs a vocabulary of at least " + std::to_string(needed) +
                " (256 bytes + " + std::to_string(specials.size()) + " special tokens), got " +
                std::to_string(vocab_size));

  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  ByteLevelTokenizerInfo info{};
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  int32_t id = 256;
  for (const auto& [content, special] : specials) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
    info.special_tokens.emplace_back(content, id);
    if (content == "]~!b[") info.bos_id = id;
    if (content == "[e~[") info.eos_id = id;
    ++id;
  }
  // A few English merges so that encoding is not purely byte by byte.
  const std::vector<std::pair<std::string, std::string>> merge_list = {
      {"Ġ", "t"},   {"h", "e"}, {"Ġ", "a"}, {"i", "n"},
      {"Ġt", "he"}, {"e", "r"}, {"o", "n"}, {"Ġ", "s"}};
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [a, b] : merge_list) {
    if (static_cast<int>(merges.size()) >= max_merges || id >= vocab_size) break;
    vocab[a + b] = id++;
    merges.push_back(a + " " + b);
  }
  info.used_ids = id;

  nlohmann::ordered_json tj = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", false},
        {"use_regex", false}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", false},
        {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  nlohmann::ordered_json cfg = {{"add_bos_token", false},
                                {"add_eos_token", false},
                                {"bos_token", "]~!b["},
                                {"eos_token", "[e~["},
                                {"model_max_length", 1 << 20},
                                {"tokenizer_class", "PreTrainedTokenizerFast"},
                                {"chat_template", minimax_chat_template()}};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create " + dir + ": " + ec.message());
  write_file(dir + "/tokenizer.json", tj.dump(2) + "\n");
  write_file(dir + "/tokenizer_config.json", cfg.dump(2) + "\n");
  return info;
}

}  // namespace sieve::text
