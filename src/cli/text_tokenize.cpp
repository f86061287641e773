// `sieve tokenize`, `sieve detokenize`, `sieve chat-template`: for people debugging prompts.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "io/jsonl.h"
#include "text/tokenizer.h"

namespace sieve::cli {
namespace {

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int run_tokenize(const std::vector<std::string>& argv) {
  Args a("tokenize", argv);
  a.opt({"--tokenizer", "--model"}, "DIR", "model or tokenizer directory (tokenizer.json)")
      .opt({"--text"}, "TEXT", "text to tokenize")
      .opt({"--file"}, "FILE", "tokenize the contents of FILE")
      .opt({"--jsonl"}, "FILE", "each line a JSON string; prints one JSON array of ids per line")
      .flag({"--json"}, "print {\"ids\", \"tokens\"} as JSON")
      .flag({"--no-special-tokens"}, "do not add bos/eos (add_special_tokens=False)");
  if (!a.parse()) return 0;
  if (!a.has("--tokenizer"))
    throw Error("sieve tokenize: --tokenizer DIR (or --model DIR) is required");
  int sources = a.has("--text") + a.has("--file") + a.has("--jsonl");
  if (sources != 1) throw Error("sieve tokenize: give exactly one of --text, --file, --jsonl");
  text::Tokenizer tok = text::Tokenizer::load(a.get("--tokenizer"));
  bool add_special = !a.get_flag("--no-special-tokens");

  if (a.has("--jsonl")) {
    io::for_each_jsonl(a.get("--jsonl"), "JSON Lines file", [&](const nlohmann::json& j, const std::string& where) {
      if (!j.is_string()) throw Error(where + ": expected a JSON string");
      std::string out = nlohmann::json(tok.encode(j.get<std::string>(), add_special)).dump();
      std::printf("%s\n", out.c_str());
    });
    return 0;
  }
  std::string text = a.has("--text") ? a.get("--text") : read_text_file(a.get("--file"));
  std::vector<int32_t> ids = tok.encode(text, add_special);
  if (a.get_flag("--json")) {
    nlohmann::json tokens = nlohmann::json::array();
    for (int32_t id : ids) tokens.push_back(tok.id_to_token(id));
    nlohmann::json out = {{"ids", ids}, {"tokens", tokens}, {"count", ids.size()}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  for (int32_t id : ids)
    std::printf("%d\t%s\n", id,
                nlohmann::json(tok.id_to_token(id))
                    .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                    .c_str());
  std::printf("%zu tokens\n", ids.size());
  return 0;
}

int run_detokenize(const std::vector<std::string>& argv) {
  Args a("detokenize", argv);
  a.opt({"--tokenizer", "--model"}, "DIR", "model or tokenizer directory (tokenizer.json)")
      .opt({"--ids"}, "IDS", "token ids, separated by commas or spaces (a JSON array works too)")
      .flag({"--skip-special-tokens"}, "leave special tokens out of the text");
  if (!a.parse()) return 0;
  if (!a.has("--tokenizer"))
    throw Error("sieve detokenize: --tokenizer DIR (or --model DIR) is required");
  if (!a.has("--ids")) throw Error("sieve detokenize: --ids is required");
  std::vector<int32_t> ids;
  std::string s = a.get("--ids"), cur;
  auto flush = [&] {
    if (cur.empty()) return;
    try {
      size_t used = 0;
      long long v = std::stoll(cur, &used);
      if (used != cur.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(cur);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      throw Error("sieve detokenize: --ids: \"" + cur + "\" is not a token id");
    }
    cur.clear();
  };
  for (char c : s) {
    if (c == ',' || c == ' ' || c == '[' || c == ']' || c == '\n' || c == '\t')
      flush();
    else
      cur += c;
  }
  flush();
  text::Tokenizer tok = text::Tokenizer::load(a.get("--tokenizer"));
  std::string text = tok.decode(ids, a.get_flag("--skip-special-tokens"));
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::printf("\n");
  return 0;
}

Register reg_tokenize{"tokenize", "print the token ids of a text (tokenizer.json)", &run_tokenize};
Register reg_detokenize{"detokenize", "print the text of token ids", &run_detokenize};

}  // namespace
}  // namespace sieve::cli
