#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>

#include "core/error.h"
#include "text/jinja/parser.h"
#include "text/jinja/runtime.h"

namespace sieve::text {

JinjaTemplate JinjaTemplate::parse(std::string source) {
  JinjaTemplate t;
  t.prog_ = jinja::parse_program(std::move(source));
  return t;
}

std::string JinjaTemplate::render(const nlohmann::json& context) const {
  return jinja::render_program(*prog_, jinja::from_json(context));
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  return jinja::render_program(*prog_, jinja::from_json(context));
}

const std::string& minimax_chat_template() {
  static const std::string t =
#include "text/minimax_chat_template.inc"
      ;
  return t;
}

namespace {

// OpenAI clients send tool-call arguments as a JSON string; templates iterate them as a
// mapping. As vLLM does before rendering: in assistant messages, arguments that are a string
// are parsed (a string that is not JSON is left as it is), and missing or empty ones become {}.
template <class J>
J with_parsed_arguments(const J& messages) {
  if (!messages.is_array()) throw Error("chat messages must be a JSON array");
  J out = messages;
  for (auto& m : out) {
    if (!m.is_object()) throw Error("each chat message must be a JSON object");
    if (m.value("role", "") != "assistant") continue;
    auto tc = m.find("tool_calls");
    if (tc == m.end() || !tc->is_array()) continue;
    for (auto& call : *tc) {
      if (!call.is_object()) continue;
      auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) continue;
      auto args = fn->find("arguments");
      if (args == fn->end() || args->is_null() ||
          (args->is_string() && args->template get<std::string>().empty())) {
        (*fn)["arguments"] = J::object();
        continue;
      }
      if (!args->is_string()) continue;
      try {
        *args = J::parse(args->template get<std::string>());
      } catch (const std::exception&) {
        // Not JSON: leave the string for the template to print.
      }
    }
  }
  return out;
}

// Parsed templates are cached per source text: parsing is cheap but the server renders the
// same template for every request.
const JinjaTemplate& cached_template(const std::string& source) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<JinjaTemplate>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(source);
  if (it == cache.end()) {
    if (cache.size() > 16) cache.clear();
    it = cache.emplace(source, std::make_shared<JinjaTemplate>(JinjaTemplate::parse(source))).first;
  }
  return *it->second;
}

template <class J>
std::string render_chat_impl(const Tokenizer& tok, const J& messages, const J& tools,
                             bool add_generation_prompt, const J& extra_kwargs) {
  const std::string& src =
      tok.chat_template().empty() ? minimax_chat_template() : tok.chat_template();
  const JinjaTemplate& t = cached_template(src);
  J ctx = J::object();
  // transformers passes the special tokens, then the keyword arguments (which may override).
  if (!tok.bos_token().empty()) ctx["bos_token"] = tok.bos_token();
  if (!tok.eos_token().empty()) ctx["eos_token"] = tok.eos_token();
  if (extra_kwargs.is_object())
    for (auto it = extra_kwargs.begin(); it != extra_kwargs.end(); ++it) ctx[it.key()] = it.value();
  else if (!extra_kwargs.is_null())
    throw Error("chat template keyword arguments must be a JSON object");
  ctx["messages"] = with_parsed_arguments(messages);
  if (!tools.is_null() && !tools.is_array()) throw Error("tools must be a JSON array or null");
  ctx["tools"] = tools;
  ctx["add_generation_prompt"] = add_generation_prompt;
  return t.render(ctx);
}

}  // namespace

std::string render_chat(const Tokenizer& tok, const nlohmann::json& messages,
                        const nlohmann::json& tools, bool add_generation_prompt,
                        const nlohmann::json& extra_kwargs) {
  return render_chat_impl(tok, messages, tools, add_generation_prompt, extra_kwargs);
}

std::string render_chat(const Tokenizer& tok, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra_kwargs) {
  return render_chat_impl(tok, messages, tools, add_generation_prompt, extra_kwargs);
}

std::string chat_template_arg(const std::string& arg) {
  std::string src;
  std::error_code ec;
  if (std::filesystem::is_regular_file(arg, ec)) {
    std::ifstream in(arg, std::ios::binary);
    src.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw Error("--chat-template: cannot read " + arg);
  } else if (arg.find("{{") != std::string::npos || arg.find("{%") != std::string::npos) {
    src = arg;
  } else {
    throw Error("--chat-template: " + arg + " is neither a file nor a Jinja template");
  }
  try {
    JinjaTemplate::parse(src);
  } catch (const Error& e) {
    throw Error(std::string("--chat-template: ") + e.what());
  }
  return src;
}

}  // namespace sieve::text
