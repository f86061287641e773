#include "server/constraints.h"

#include <algorithm>

#include "core/error.h"
#include "server/protocol.h"

namespace sieve::server {

// Guided decoding's view of the vocabulary: each token's bytes; special tokens none (they never
// belong to a constrained output; end-of-sequence is the constraint's own business), but for the
// parsers' markers.
std::shared_ptr<const guided::TokenBytes> GuidedConstraints::vocab() {
  std::call_once(vocab_once_, [this] {
    auto v = std::make_shared<guided::TokenBytes>(size_t(tok_.vocab_size()));
    for (int32_t id = 0; id < tok_.vocab_size(); ++id)
      if (!tok_.is_special(id) || std::count(markers_.begin(), markers_.end(), id))
        (*v)[size_t(id)] = tok_.token_bytes(id);
    vocab_ = std::move(v);
  });
  return vocab_;
}

std::shared_ptr<const guided::OutputConstraint> GuidedConstraints::json_object() {
  std::call_once(json_once_, [this] { json_ = guided::json_object_constraint(vocab()); });
  return json_;
}

std::shared_ptr<const guided::OutputConstraint> GuidedConstraints::choice(
    const std::vector<std::string>& choices) {
  return guided::choice_constraint(vocab(), choices);
}

std::shared_ptr<const guided::OutputConstraint> GuidedConstraints::compiled(
    const std::string& kind, const std::string& text, const std::string& param) {
  const std::string key = kind + ":" + text;
  {
    std::lock_guard lk(mu_);
    if (auto it = compiled_.find(key); it != compiled_.end()) return it->second;
  }
  std::shared_ptr<const guided::OutputConstraint> c;
  try {
    c = kind == "regex"     ? guided::regex_constraint(vocab(), text)
        : kind == "grammar" ? guided::grammar_constraint(vocab(), text)
                            : guided::json_schema_constraint(vocab(), text);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), param);
  }
  std::lock_guard lk(mu_);
  if (compiled_.size() >= 64) compiled_.clear();
  compiled_.emplace(key, c);
  return c;
}

}  // namespace sieve::server
