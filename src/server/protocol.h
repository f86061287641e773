// The OpenAI request schema as vLLM accepts it: parsing and validation of /v1/completions and
// /v1/chat/completions bodies into engine parameters, and OpenAI-style error objects. Pure
// functions of the JSON, so they are unit- and fuzz-tested without a server.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace sieve::server {

// A request the server refuses. Answered as {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string type = {})
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        type(std::move(type)) {}
  int status;
  std::string param;
  std::string type;  // empty: derived from the status
};

nlohmann::json error_json(int status, const std::string& message, const std::string& param = {},
                          const std::string& type = {});

// One prompt of a completions request: text, or (when text is empty) token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
};

// At most this many choices (prompts x n) in one request.
inline constexpr int64_t kMaxChoices = 1024;

struct GenerateRequest {
  bool chat = false;
  std::string model;  // empty: the served model
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats
  // Completions: one prompt, or a batch (choice i * n + j is sample j of prompt i).
  std::vector<PromptInput> prompts;
  bool echo = false;
  // echo with max_tokens 0: the prompt alone (one token is generated and left out, as vLLM).
  bool prompt_only = false;
  int n = 1;  // completions per prompt; with a seed, sample j draws with seed + j
  // Chat.
  nlohmann::ordered_json messages, tools, chat_template_kwargs;
  // "none", "auto" (the default when tools are given), "required", or "function:NAME" (a named
  // function; the last two make the output open a call, with the tool parser on).
  std::string tool_choice = "none";
  // Guided decoding: "" (none), "json_object" (response_format json_object, or
  // structured_outputs.json_object), "json_schema" (response_format json_schema, guided_json,
  // structured_outputs.json), "regex" (guided_regex, structured_outputs.regex), "grammar"
  // (guided_grammar, structured_outputs.grammar) or "choice" (guided_choice, or
  // structured_outputs.choice).
  std::string guided;
  std::vector<std::string> guided_choice;
  std::string guided_schema;  // json_schema: the schema's JSON text; regex: the pattern; grammar: its text
  std::string guided_param;   // the field that asked for it (errors name it)
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool add_special_tokens = true;  // completions: true, chat: false (the template adds them)

  engine::SamplingParams params;
  bool max_tokens_given = false;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool return_tokens_as_token_ids = false;  // logprobs name tokens "token_id:N" (vLLM's option)
  // Completions: logprobs = N alternatives (0..max_logprobs); chat: logprobs bool + top_logprobs.
  bool want_logprobs = false;
  int top_logprobs = 0;
};

// Server-wide defaults of what a request leaves out, as vLLM applies them: the sampling fields
// come from vLLM's neutral values or from the model's generation config (`--generation-config`,
// `--override-generation-config`); max_logprobs bounds the alternatives a request may ask for
// (`--max-logprobs`).
struct RequestDefaults {
  double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
  int top_k = 0;          // 0: off
  int64_t max_tokens = 0;  // the generation config's max_new_tokens: caps every request's max_tokens; 0: none
  int max_logprobs = 20;
  // `--default-chat-template-kwargs` (an object): the keys a request's chat_template_kwargs
  // leaves out.
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
};

// Checks chat template keyword arguments (an object): thinking_mode, when given, is "enabled",
// "disabled" or "adaptive" (MiniMax-M3's template). Returns an empty string or what is wrong.
std::string check_chat_template_kwargs(const nlohmann::ordered_json& kwargs);

// The defaults a Hugging Face generation config gives, as vLLM reads it: of repetition_penalty,
// temperature, top_k, top_p, min_p and max_new_tokens, the keys the file sets to something other
// than transformers' own defaults (1.0, 1.0, 50, 1.0, none, none), then every key of
// `overrides` (an object, possibly empty). Throws Error naming the key for a value of the wrong
// type or range. `base` supplies what neither sets.
RequestDefaults request_defaults_from(const nlohmann::json& generation_config, const nlohmann::json& overrides,
                                      RequestDefaults base = {});

// Throws ApiError(400) naming the field for anything malformed: wrong types, out-of-range
// values, best_of other than n, more than kMaxChoices choices, missing prompt/messages, more
// log-prob alternatives than defaults.max_logprobs.
GenerateRequest parse_generate_request(const nlohmann::ordered_json& body, bool chat,
                                       const RequestDefaults& defaults = {});

// Parses a request body that must be a JSON object nesting at most kMaxJsonDepth levels;
// ApiError(400) otherwise.
inline constexpr int kMaxJsonDepth = 512;
nlohmann::ordered_json parse_json_body(const std::string& body);

}  // namespace sieve::server
