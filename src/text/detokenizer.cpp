#include "text/detokenizer.h"

#include <algorithm>

#include "text/unicode.h"

namespace sieve::text {

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens,
                             std::vector<int32_t> keep)
    : tok_(&tok), skip_special_(skip_special_tokens), keep_(std::move(keep)) {}

std::string StreamDecoder::push(int32_t id) {
  const std::string& bytes = tok_->token_bytes(id);
  if (skip_special_ && tok_->is_special(id) &&
      std::find(keep_.begin(), keep_.end(), id) == keep_.end())
    return "";
  pending_ += bytes;
  // Emit everything up to the last sequence that could still be completed by later bytes.
  size_t i = 0, keep = pending_.size();
  while (i < pending_.size()) {
    int len = utf8_sequence_length(pending_, i);
    if (len < 0) {
      keep = i;
      break;
    }
    i += len > 0 ? len : 1;  // invalid bytes are final: utf8_lossy replaces them below
  }
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, keep));
  pending_.erase(0, keep);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace sieve::text
