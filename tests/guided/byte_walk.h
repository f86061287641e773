// Guided-decoding tests: a vocabulary of the 256 single bytes (id 256: end of sequence) walks a
// text through a constraint's mask, byte by byte.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "guided/guided.h"

namespace sieve::guided::testing {

struct ByteWalk {
  std::shared_ptr<TokenBytes> vocab = std::make_shared<TokenBytes>(257);
  ByteWalk() {
    for (int b = 0; b < 256; ++b) (*vocab)[size_t(b)] = std::string(1, char(b));
  }
  // 1: the text is accepted and complete; 0: accepted as a prefix; -1: some byte is masked.
  int walk(const std::shared_ptr<const OutputConstraint>& c, const std::string& text) const {
    auto st = c->start();
    for (char ch : text) {
      std::vector<float> l(vocab->size(), 0.0f);
      st->mask(l, std::vector<int32_t>{256});
      if (!std::isfinite(l[uint8_t(ch)])) return -1;
      st->accept(uint8_t(ch));
    }
    return st->complete() ? 1 : 0;
  }
};

}  // namespace sieve::guided::testing
