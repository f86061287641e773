// Stop strings on detokenized text. A stop string may span several tokens, so text that could be
// the start of one is held back until the next piece decides; the stop string itself and
// anything after it are never emitted.
#pragma once

#include <string>
#include <vector>

namespace sieve::engine {

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

}  // namespace sieve::engine
