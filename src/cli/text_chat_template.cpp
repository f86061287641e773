// `sieve chat-template`: prints the prompt a model's chat template makes of a conversation.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace sieve::cli {
namespace {

nlohmann::ordered_json read_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::ordered_json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not JSON: " + e.what());
  }
}

int run_chat_template(const std::vector<std::string>& argv) {
  Args a("chat-template", argv);
  a.opt({"--tokenizer", "--model"}, "DIR", "model or tokenizer directory")
      .opt({"--messages"}, "FILE.json",
           "a JSON array of messages, or an object with \"messages\" (and \"tools\")")
      .opt({"--tools"}, "FILE.json", "a JSON array of tool definitions")
      .opt({"--kwargs"}, "JSON", "extra template variables, e.g. '{\"enable_thinking\": false}'")
      .opt({"--chat-template"}, "FILE|TEMPLATE", "chat template file, or the template itself, instead of the model's")
      .flag({"--add-generation-prompt"}, "end with the assistant turn's opening")
      .flag({"--tokenize"}, "print the prompt's token ids after it");
  if (!a.parse()) return 0;
  if (!a.has("--tokenizer"))
    throw Error("sieve chat-template: --tokenizer DIR (or --model DIR) is required");
  if (!a.has("--messages")) throw Error("sieve chat-template: --messages FILE.json is required");
  nlohmann::ordered_json doc = read_json_file(a.get("--messages"));
  nlohmann::ordered_json messages = doc, tools = nullptr, kwargs = nullptr;
  if (doc.is_object()) {
    if (!doc.contains("messages"))
      throw Error(a.get("--messages") + ": expected an array of messages or {\"messages\": [...]}");
    messages = doc["messages"];
    if (doc.contains("tools")) tools = doc["tools"];
  }
  if (a.has("--tools")) tools = read_json_file(a.get("--tools"));
  if (a.has("--kwargs")) {
    try {
      kwargs = nlohmann::ordered_json::parse(a.get("--kwargs"));
    } catch (const nlohmann::json::exception& e) {
      throw Error(std::string("sieve chat-template: --kwargs is not JSON: ") + e.what());
    }
  }
  text::Tokenizer tok = text::Tokenizer::load(a.get("--tokenizer"));
  if (a.has("--chat-template")) tok.set_chat_template(text::chat_template_arg(a.get("--chat-template")));
  std::string prompt =
      text::render_chat(tok, messages, tools, a.get_flag("--add-generation-prompt"), kwargs);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  if (a.get_flag("--tokenize")) {
    // The template writes bos itself when the model wants it.
    std::printf("\n%s\n", nlohmann::json(tok.encode(prompt, false)).dump().c_str());
  }
  return 0;
}

Register reg{"chat-template", "print the prompt a chat template makes of messages",
             &run_chat_template};

}  // namespace
}  // namespace sieve::cli
