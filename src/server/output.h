// Output assembly: a request's choices as the engine's tokens turn into text (detokenized, cut
// at stop strings, split into reasoning, content and tool calls) with their log-probs, and the
// JSON pieces responses are made of. Transport-free: responses.h writes them out.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/protocol.h"
#include "server/reasoning.h"
#include "server/stop_strings.h"
#include "server/tool_calls.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace sieve::server {

// Characters (code points) of UTF-8 text: text offsets count them, as Python's str does in vLLM.
int64_t code_points(std::string_view s);
std::string random_hex(int n);
int64_t unix_now();

// Per-choice output: detokenize, match stop strings, collect logprobs.
struct Output {
  const text::Tokenizer& tok;
  text::StreamDecoder dec;
  StopStringMatcher stop;
  bool include_stop;
  bool chat;
  bool want_logprobs;
  bool ids_as_tokens;
  int64_t min_tokens;
  int64_t completion_tokens = 0;
  bool stopped_by_string = false;
  std::string text;  // everything emitted so far
  int64_t text_chars = 0;
  int32_t last_token = -1;
  nlohmann::json stop_reason = nullptr;
  // Completions logprobs (legacy format) or chat logprobs content entries, for what was emitted.
  nlohmann::json lp_tokens = nlohmann::json::array(), lp_values = nlohmann::json::array(),
                 lp_top = nlohmann::json::array(), lp_offsets = nlohmann::json::array();
  nlohmann::json chat_lp = nlohmann::json::array();

  // `keep`: special tokens the chat's parsers read (parser_marker_ids), kept in the text.
  Output(const text::Tokenizer& t, const GenerateRequest& g, std::vector<int32_t> keep = {});

  // A model's vocabulary may be larger than its tokenizer's (padded embeddings); ids without a
  // token decode to nothing rather than failing the request.
  bool known(int32_t id) const { return id >= 0 && id < tok.vocab_size(); }
  std::string token_str(int32_t id) const;
  nlohmann::json token_bytes(int32_t id) const;
  // Feeds one token; returns the text it releases. Sets stopped_by_string on a match.
  std::string push(const engine::TokenOutput& t, nlohmann::json* lp_delta);
  // Offsets count characters (code points), as Python's str does in vLLM, not bytes.
  void append(const std::string& s);
  // End of generation: what the decoder and the stop matcher still hold.
  std::string finish();
  nlohmann::json completion_logprobs() const;
};

// One choice of a request: sample j of prompt i is choice i * n + j.
struct Choice {
  int index = 0;
  size_t prompt = 0;
  std::shared_ptr<engine::RequestStream> rs;
  std::unique_ptr<Output> out;
  engine::FinishReason fin = engine::FinishReason::None;
  bool finished = false;  // no more tokens will come (fin is final)
  // echo with logprobs: the prompt's log-probs (positions 1, 2, ...), with the first token.
  std::vector<engine::PromptTokenLogprob> prompt_lp;
  bool prompt_lp_in = false;   // they arrived
  bool prompt_lp_out = false;  // streaming: the echo chunk that carries them was written
  std::unique_ptr<ReasoningSplitter> think;  // chat with --reasoning-parser
  // Chat with --tool-call-parser and a tool_choice other than "none": the content through the
  // parser.
  bool parse_tools = false;
  ToolCallStream tool_stream;
};

// A request's choices and what its responses repeat.
struct Generation {
  GenerateRequest g;
  std::vector<Choice> choices;
  std::vector<std::vector<int32_t>> prompt_ids;  // per prompt
  std::vector<std::string> echo;  // per prompt: the text a completion with echo repeats
  std::string id;
  int64_t created = 0;
  bool started = false, finished = false;

  int64_t usage_prompt() const;
  int64_t usage_completion() const;
  bool all_finished() const;
};

// Aborts every choice still running (their blocks are freed at the engine's next turn).
void abort_all(engine::Engine& engine, Generation& gen,
               engine::FinishReason why = engine::FinishReason::Abort);

// Takes what a choice's stream has (waiting up to `wait`); true when it produced anything
// (tokens or its end). `lp_delta`: streaming logprobs of the new tokens; `text`: their text.
bool pump(engine::Engine& engine, const GenerateRequest& g, Choice& c,
          std::chrono::milliseconds wait, std::string* text, nlohmann::json* lp_delta);

// The stop reason of a finished choice: the matched stop string, or the stop token id that
// ended it (not EOS alone), as vLLM reports.
nlohmann::json stop_reason_of(const Choice& c, const GenerateRequest& g);
const char* finish_name(engine::FinishReason f, bool stopped_by_string);

// A choice's new text through the reasoning splitter and the tool-call parser, where they are
// on: what goes out now as reasoning, content and tool calls and, once the choice has finished,
// its finish reason. Streams pass each piece (and get the calls' new pieces, numbered), a full
// response the whole text (and gets the calls whole once finished).
struct ChatText {
  std::string reasoning, content;
  nlohmann::json tool_calls = nullptr;  // when there are calls (a stream: their new pieces)
  nlohmann::json finish = nullptr;      // once finished
};
ChatText chat_text(const GenerateRequest& g, Choice& c, std::string text, bool stream);

nlohmann::json usage_json(int64_t prompt, int64_t completion);
// Completions logprobs of a choice's prompt (echo with logprobs): its tokens, their log-probs
// (the first null) and alternatives, and their offsets in the echoed text.
nlohmann::json prompt_logprobs_json(const text::Tokenizer& tok, const Generation& gen,
                                    const Choice& c);
// The prompt's completions logprobs followed by the generated tokens' (`lp`).
nlohmann::json with_prompt_logprobs(nlohmann::json prompt, const nlohmann::json& lp);

}  // namespace sieve::server
