// Guided decoding's constraints as the server builds them for requests: over the tokenizer's
// vocabulary (made once), with compiled schemas, patterns and grammars kept by their text
// (clients tend to send the same few again and again).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "guided/guided.h"
#include "text/tokenizer.h"

namespace sieve::server {

class GuidedConstraints {
 public:
  // `markers`: special tokens the chat parsers read; a constrained output may contain them (forced
  // tool calls do), while other special tokens never belong to one.
  GuidedConstraints(const text::Tokenizer& tok, std::vector<int32_t> markers)
      : tok_(tok), markers_(std::move(markers)) {}
  // One JSON constraint serves every request (its states are per request).
  std::shared_ptr<const guided::OutputConstraint> json_object();
  std::shared_ptr<const guided::OutputConstraint> choice(const std::vector<std::string>& choices);
  // kind: "regex", "grammar" or "json_schema". Throws ApiError(400) naming `param` when `text`
  // does not compile.
  std::shared_ptr<const guided::OutputConstraint> compiled(const std::string& kind,
                                                           const std::string& text,
                                                           const std::string& param);

 private:
  std::shared_ptr<const guided::TokenBytes> vocab();

  const text::Tokenizer& tok_;
  std::vector<int32_t> markers_;
  std::once_flag vocab_once_, json_once_;
  std::shared_ptr<const guided::TokenBytes> vocab_;
  std::shared_ptr<const guided::OutputConstraint> json_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const guided::OutputConstraint>> compiled_;
};

}  // namespace sieve::server
