#include "server/stop_strings.h"

#include <algorithm>

namespace sieve::server {

size_t held_tail(std::string_view text, std::span<const std::string> tags) {
  size_t hold = 0;
  for (const auto& s : tags) {
    if (s.empty()) continue;
    const size_t max_len = std::min(s.size() - 1, text.size());
    for (size_t len = max_len; len > hold; --len)
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
  }
  return hold;
}

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
  const size_t hold = held_tail(pending_, stops_);
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

}  // namespace sieve::server
