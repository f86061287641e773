// Byte-level BPE tokenizer read from a Hugging Face model directory (tokenizer.json and, when
// present, tokenizer_config.json, generation_config.json, chat_template.jinja): the family of
// MiniMax, Qwen, Llama-3 and GPT-2. What is supported is listed in docs/text.md; anything else
// in tokenizer.json is refused at load with a message naming it.
//
// Thread-safe for concurrent const use: encode/decode keep no shared mutable state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sieve::text {

struct TokenizerImpl;

class Tokenizer {
 public:
  // `dir` holds tokenizer.json; the other files are optional.
  static Tokenizer load(const std::string& dir);
  // From already-parsed files (config may be null). `origin` names them in error messages.
  static Tokenizer from_json(const nlohmann::json& tokenizer_json,
                             const nlohmann::json& tokenizer_config = nullptr,
                             const nlohmann::json& generation_config = nullptr,
                             const std::string& origin = "tokenizer.json");

  // `text` must be valid UTF-8 (else sieve::Error with the byte offset). Added and special
  // tokens written in the text are recognized. add_special_tokens: add bos when the config says
  // add_bos_token (or the post-processor's template adds special tokens).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Bytes that are not UTF-8 (a character cut between ids) become U+FFFD. Ids out of range
  // throw sieve::Error.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  // The raw bytes token `id` stands for (empty for skipped specials); what StreamDecoder joins.
  const std::string& token_bytes(int32_t id) const;

  int32_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // as written in tokenizer.json; "" if unknown
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::vector<int32_t> eos_ids() const;
  std::string bos_token() const;
  std::string eos_token() const;
  const std::string& chat_template() const;  // empty if none
  // Replaces the model's chat template for this copy (`sieve serve --chat-template`).
  void set_chat_template(std::string source) { chat_template_override_ = std::move(source); }
  bool add_bos_token() const;
  // Every added token (special or not) with its id, in id order.
  std::vector<std::pair<int32_t, std::string>> added_tokens() const;

  // Copies share the same immutable tables.
 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const TokenizerImpl> impl_;
  std::optional<std::string> chat_template_override_;
};

}  // namespace sieve::text
