// What the engine needs of guided decoding: a constraint built once per request kind, and a
// per-request state that masks the logits before each draw and follows the sampled tokens. The
// compilers behind it (JSON, JSON schema, regex, grammar, choice) are in guided.h; the engine
// sees only this interface, so it does not link them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace sieve::guided {

// The bytes of each token id ("" for ids that never may come: special or unknown ones).
using TokenBytes = std::vector<std::string>;

class OutputConstraint {
 public:
  class State {
   public:
    virtual ~State() = default;
    // Sets the logits of tokens that may not come next to -inf; the end-of-sequence ids stay
    // only when the output is complete (or nothing else could follow, so the request can end).
    virtual void mask(std::span<float> logits, std::span<const int32_t> eos_ids) const = 0;
    virtual void accept(int32_t token) = 0;
    virtual bool complete() const = 0;
    // Complete, and nothing may follow: the request ends here (it need not sample an
    // end-of-sequence token, which a model may not even have).
    virtual bool must_end() const = 0;
  };
  virtual ~OutputConstraint() = default;
  virtual std::unique_ptr<State> start() const = 0;
};

}  // namespace sieve::guided
