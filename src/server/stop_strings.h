// Stop strings on detokenized text. A stop string may span several tokens, so text that could be
// the start of one is held back until the next piece decides; the stop string itself and
// anything after it are never emitted.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sieve::server {

// The length of the longest tail of `text` that is a proper prefix of one of `tags`: text a
// stream must hold back until the next piece tells whether a tag starts there.
size_t held_tail(std::string_view text, std::span<const std::string> tags);

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends newly decoded text; returns the text that is now safe to emit. After a match,
  // stopped() is true and later pushes return nothing.
  std::string push(const std::string& piece);
  // Appends text that must not end generation (before min_tokens): emitted as is, together with
  // anything held back.
  std::string push_unchecked(const std::string& piece);
  // End of generation without a match: releases the held-back text.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace sieve::server
