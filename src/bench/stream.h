// Reading an OpenAI-style SSE stream into a RequestRecord, without any network: the HTTP client
// feeds bytes in, tests feed strings in.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "bench/metrics.h"

namespace sieve::bench {

// Splits a byte stream into SSE `data:` payloads (one per line; other fields and comments are
// ignored). Bytes may arrive in arbitrary pieces.
class SseSplitter {
 public:
  void feed(std::string_view bytes, const std::function<void(std::string_view payload)>& on_data);

 private:
  std::string pending_;
};

// What one request's stream told us beyond the record's own fields.
struct StreamState {
  bool chat = false;  // /v1/chat/completions: text in choices[0].delta.content
  int usage_prompt_tokens = -1;
  bool done = false;  // saw [DONE]
};

// Applies one payload received at time `t`: a chunk with non-empty `choices` stamps a chunk time
// and appends its text; `usage` sets the token counts; an `error` object or unparsable JSON
// records an error (the first one is kept).
void apply_sse_payload(std::string_view payload, double t, StreamState& st, RequestRecord& rec);

}  // namespace sieve::bench
