// Chat templates: a renderer for the Jinja subset that Hugging Face chat templates use,
// configured as transformers configures Jinja2 (trim_blocks, lstrip_blocks, loop controls,
// transformers' tojson, raise_exception, strftime_now), and render_chat, which builds the
// context transformers' apply_chat_template builds. docs/text.md lists what is supported.
//
// Errors (syntax or at render time) are sieve::Error with "line L, column C" of the template.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace sieve::text {

namespace jinja {
struct Program;
}

class JinjaTemplate {
 public:
  // Throws sieve::Error naming line and column on a syntax error.
  static JinjaTemplate parse(std::string source);
  // `context` is an object whose keys become template variables. Use ordered_json where the
  // order of object keys must survive (tool schemas under tojson): Jinja2 keeps insertion order,
  // and nlohmann::json sorts keys.
  std::string render(const nlohmann::json& context) const;
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const jinja::Program> prog_;
};

// Renders `messages` with the tokenizer's chat template, or the built-in MiniMax format when
// the tokenizer has none. `tools`: null or an array; `extra_kwargs`: null or an object whose
// keys become variables (e.g. {"enable_thinking": false}). bos_token and eos_token come from the
// tokenizer. Throws sieve::Error with the template location on template errors.
std::string render_chat(const Tokenizer& tok, const nlohmann::json& messages,
                        const nlohmann::json& tools, bool add_generation_prompt,
                        const nlohmann::json& extra_kwargs);
// Same, keeping object key order (what the server should pass for request JSON).
std::string render_chat(const Tokenizer& tok, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra_kwargs);

// The value of a --chat-template option, as vLLM takes it: a file's contents, or the argument
// itself when it is no file but looks like a template ("{{" or "{%"). Parsed here, so a broken
// template fails at start; Error messages start with "--chat-template".
std::string chat_template_arg(const std::string& arg);

// The built-in MiniMax chat format (spec section 7) as a Jinja template; used when a model
// ships no template and written by write_byte_level_tokenizer.
const std::string& minimax_chat_template();

}  // namespace sieve::text
