// Streaming detokenization: ids arrive one at a time from the engine and text leaves in SSE
// chunks. A character split across ids (emoji, CJK under byte-level BPE) is held back until it
// is complete, so every chunk is valid UTF-8 and the chunks joined equal Tokenizer::decode of
// all the ids (bytes that can never become a character are replaced by U+FFFD in both).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace sieve::text {

class StreamDecoder {
 public:
  // Keeps a reference: `tok` must outlive the decoder. `keep`: special tokens that stay in the
  // text even with skip_special_tokens (the markers a reasoning or tool-call parser reads).
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = true,
                         std::vector<int32_t> keep = {});

  // Returns the text completed by this id (possibly empty). Throws sieve::Error for an id
  // outside the vocabulary.
  std::string push(int32_t id);
  // Ends the stream: returns what is still held back (an incomplete character becomes U+FFFD).
  std::string flush();
  // Bytes held back waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> keep_;
  std::string pending_;
};

}  // namespace sieve::text
