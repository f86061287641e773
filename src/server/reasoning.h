// Reasoning parsers for chat completions (`sieve serve --reasoning-parser`): the text a model
// writes inside <think> ... </think> goes to the message's `reasoning` (and, for older clients,
// `reasoning_content`), the rest to `content`, as vLLM's reasoning parsers for MiniMax-M2/M3
// and DeepSeek-R1-style models return it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sieve::server {

// The parser names `--reasoning-parser` accepts; all of them split on <think> / </think>.
const std::vector<std::string>& reasoning_parser_names();

// Whether a rendered chat prompt ends inside an open <think> block: the model's output then
// starts in its reasoning (a template that opens the block for the model, as MiniMax's does when
// thinking is on).
bool prompt_opens_reasoning(std::string_view prompt);

// Splits generated text, fed in pieces as it streams, into reasoning and content. A <think> in
// the content opens reasoning, a </think> in the reasoning closes it; the tags themselves are
// dropped. A suffix that could begin a tag is held back until the next piece (or finish())
// decides.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool start_in_reasoning) : in_reasoning_(start_in_reasoning) {}
  struct Piece {
    std::string reasoning, content;
  };
  Piece push(std::string_view text);
  Piece finish();  // the held-back rest, as text of the current part

 private:
  bool in_reasoning_;
  std::string held_;
};

}  // namespace sieve::server
