// Reasoning parsers for chat completions (`sieve serve --reasoning-parser`): the text a model
// writes inside its thinking block goes to the message's `reasoning` (and, for older clients,
// `reasoning_content`), the rest to `content`, as vLLM's and SGLang's reasoning parsers return it.
//  - minimax_m3: <mm:think> ... </mm:think>. The block can only open the reply (or the prompt
//    opens it: thinking_mode "enabled"), a reply that does not think may open with one stray
//    </mm:think> (dropped), and after the block everything is content, markers included.
//  - minimax_m2, deepseek_r1, qwen3: <think> ... </think>, wherever they come; each tag toggles.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sieve::server {

// The parser names `--reasoning-parser` accepts.
const std::vector<std::string>& reasoning_parser_names();

struct ReasoningFormat {
  std::string open, close;  // the markers
  // MiniMax-M3's rules (above); otherwise the markers toggle wherever they come.
  bool m3 = false;
  // How a request turns thinking off, for error messages.
  std::string thinking_off;
};

// The format of a parser of reasoning_parser_names(); an unknown name is MiniMax-M3's.
const ReasoningFormat& reasoning_format(const std::string& parser);

// Whether a rendered chat prompt ends (but for whitespace) with the opening marker: the model's
// output then starts in its reasoning (thinking_mode "enabled" for MiniMax-M3, a template that
// opens <think> for MiniMax-M2 or Qwen3).
bool prompt_opens_reasoning(const ReasoningFormat& f, std::string_view prompt);

// The message of the error a request gets when guided decoding would constrain its reasoning
// (the prompt opens it): the whole output would be reasoning.
std::string guided_in_reasoning_message(const ReasoningFormat& f);

// Splits generated text, fed in pieces as it streams, into reasoning and content; the markers
// themselves are dropped. A suffix that could begin a marker that matters now is held back until
// the next piece (or finish()) decides.
class ReasoningSplitter {
 public:
  ReasoningSplitter(const ReasoningFormat& f, bool start_in_reasoning)
      : f_(&f), in_reasoning_(start_in_reasoning), at_start_(!start_in_reasoning) {}
  struct Piece {
    std::string reasoning, content;
  };
  Piece push(std::string_view text);
  Piece finish();  // the held-back rest, as text of the current part

 private:
  const ReasoningFormat* f_;
  bool in_reasoning_;
  bool at_start_;  // M3: nothing of the reply decided yet (a leading marker may come)
  bool done_ = false;  // M3: the block is over, the rest is content
  std::string held_;
};

}  // namespace sieve::server
