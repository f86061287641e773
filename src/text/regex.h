// A compiled PCRE2 pattern (UTF + UCP, JIT when available) for the Split pre-tokenizers.
// Patterns in tokenizer.json are written for Oniguruma; the ones byte-level BPE tokenizers use
// (\p{..} classes, (?i:..) groups, lookahead, possessive and atomic forms) mean the same in PCRE2.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace sieve::text {

class Regex {
 public:
  // literal: match `pattern` as plain text. Throws sieve::Error naming `what` on a bad pattern.
  Regex(const std::string& pattern, bool literal, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(start, end) for each non-overlapping match, left to right. `s` must be valid UTF-8.
  // Safe to call from several threads at once.
  void for_each_match(std::string_view s, const std::function<void(size_t, size_t)>& fn) const;

 private:
  void* code_;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace sieve::text
