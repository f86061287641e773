#include "server/reasoning.h"

#include <algorithm>

#include "server/stop_strings.h"

namespace sieve::server {

namespace {

const std::string kOpen = "<think>";
const std::string kClose = "</think>";

}  // namespace

const std::vector<std::string>& reasoning_parser_names() {
  static const std::vector<std::string> names = {"minimax_m3", "minimax_m2", "deepseek_r1", "qwen3"};
  return names;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(kClose);
  return close == std::string_view::npos || close < open;
}

ReasoningSplitter::Piece ReasoningSplitter::push(std::string_view text) {
  Piece out;
  std::string buf = held_;
  buf.append(text);
  held_.clear();
  size_t at = 0;
  while (at < buf.size()) {
    const std::string& tag = in_reasoning_ ? kClose : kOpen;
    std::string& dst = in_reasoning_ ? out.reasoning : out.content;
    const size_t hit = buf.find(tag, at);
    if (hit != std::string::npos) {
      dst.append(buf, at, hit - at);
      at = hit + tag.size();
      in_reasoning_ = !in_reasoning_;
      continue;
    }
    const std::string_view rest = std::string_view(buf).substr(at);
    const size_t keep = held_tail(rest, std::span<const std::string>(&tag, 1));
    dst.append(rest.substr(0, rest.size() - keep));
    held_ = std::string(rest.substr(rest.size() - keep));
    break;
  }
  return out;
}

ReasoningSplitter::Piece ReasoningSplitter::finish() {
  Piece out;
  (in_reasoning_ ? out.reasoning : out.content) = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace sieve::server
