#include "server/reasoning.h"

#include <algorithm>
#include <span>

#include "server/stop_strings.h"

namespace sieve::server {

namespace {

const ReasoningFormat kM3{"<mm:think>", "</mm:think>", true,
                          "set chat_template_kwargs.thinking_mode to \"disabled\" or \"adaptive\""};
const ReasoningFormat kThink{"<think>", "</think>", false, "set chat_template_kwargs.enable_thinking to false"};

// Whether `s` is a proper, non-empty prefix of `tag`.
bool proper_prefix(std::string_view s, std::string_view tag) {
  return !s.empty() && s.size() < tag.size() && tag.substr(0, s.size()) == s;
}

}  // namespace

const std::vector<std::string>& reasoning_parser_names() {
  static const std::vector<std::string> names = {"minimax_m3", "minimax_m2", "deepseek_r1", "qwen3"};
  return names;
}

const ReasoningFormat& reasoning_format(const std::string& parser) {
  return parser == "minimax_m2" || parser == "deepseek_r1" || parser == "qwen3" ? kThink : kM3;
}

bool prompt_opens_reasoning(const ReasoningFormat& f, std::string_view prompt) {
  size_t end = prompt.size();
  while (end > 0 && (prompt[end - 1] == ' ' || prompt[end - 1] == '\n' || prompt[end - 1] == '\t' ||
                     prompt[end - 1] == '\r'))
    --end;
  return prompt.substr(0, end).ends_with(f.open);
}

std::string guided_in_reasoning_message(const ReasoningFormat& f) {
  return "guided decoding with thinking on is not supported: the prompt opens the reasoning (" + f.open +
         "), so the whole constrained output would be reasoning; " + f.thinking_off;
}

ReasoningSplitter::Piece ReasoningSplitter::push(std::string_view text) {
  Piece out;
  std::string buf = held_;
  buf.append(text);
  held_.clear();
  size_t at = 0;
  while (at < buf.size()) {
    const std::string_view rest = std::string_view(buf).substr(at);
    if (f_->m3 && done_) {
      out.content.append(rest);
      break;
    }
    if (f_->m3 && at_start_) {
      // Only the reply's first characters can open the block, or be the one stray closer of a
      // reply that does not think.
      if (rest.starts_with(f_->open) || rest.starts_with(f_->close)) {
        const bool opens = rest.starts_with(f_->open);
        at += opens ? f_->open.size() : f_->close.size();
        at_start_ = false;
        in_reasoning_ = opens;
        done_ = !opens;
        continue;
      }
      if (proper_prefix(rest, f_->open) || proper_prefix(rest, f_->close)) {
        held_ = std::string(rest);
        break;
      }
      at_start_ = false;
      done_ = true;
      continue;
    }
    const std::string& tag = in_reasoning_ ? f_->close : f_->open;
    std::string& dst = in_reasoning_ ? out.reasoning : out.content;
    const size_t hit = buf.find(tag, at);
    if (hit != std::string::npos) {
      dst.append(buf, at, hit - at);
      at = hit + tag.size();
      in_reasoning_ = !in_reasoning_;
      if (f_->m3) done_ = true;  // the block closed: the rest is content
      continue;
    }
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
