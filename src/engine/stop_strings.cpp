#include "engine/stop_strings.h"

#include <algorithm>

namespace sieve::engine {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringMatcher::push(const std::string& piece) {
  if (stopped_) return {};
  pending_ += piece;
  if (stops_.empty()) {
    std::string out;
    out.swap(pending_);
    return out;
  }
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    size_t pos = pending_.find(s);
    if (pos < best) {
      best = pos;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::push_unchecked(const std::string& piece) {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  return out + piece;
}

std::string StopStringMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace sieve::engine
