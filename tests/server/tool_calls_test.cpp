// The MiniMax tool-call parser of --tool-call-parser: the format the chat template renders, values
// typed by the request's tool schemas, calls cut short, and streaming cut at every position.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "../guided/byte_walk.h"
#include "guided/guided.h"
#include "text/byte_level.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace sieve::server {
namespace {

using ojson = nlohmann::ordered_json;

const std::string NS = "]<]minimax[>[";

// Two calls as the built-in template renders an assistant message's tool_calls.
std::string two_calls() {
  return "Let me check.\n" + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">\n" + NS +
         "<parameter name=\"city\">Paris" + NS + "</parameter>\n" + NS + "<parameter name=\"days\">3" + NS +
         "</parameter>\n" + NS + "<parameter name=\"zip\">75001" + NS + "</parameter>\n" + NS + "</invoke>\n" + NS +
         "<invoke name=\"note\">\n" + NS + "<parameter name=\"tags\">[\"a\", \"b\"]" + NS + "</parameter>\n" + NS +
         "<parameter name=\"text\">\nline one\nline two\n" + NS + "</parameter>\n" + NS + "</invoke>\n" + NS +
         "</tool_call>";
}

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "note", "parameters": {"type": "object", "properties": {
    "tags": {"type": "array"}, "text": {"type": "string"}}}}}])");

TEST(ToolCalls, ParsesTheTemplatesFormatTypedBySchema) {
  ToolCallParse tp = parse_tool_calls(two_calls(), kTools);
  EXPECT_EQ(tp.content, "Let me check.\n");
  ASSERT_EQ(tp.calls.size(), 2u);
  EXPECT_EQ(tp.calls[0].name, "get_weather");
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"city":"Paris","days":3,"zip":"75001"})");
  EXPECT_EQ(tp.calls[1].name, "note");
  EXPECT_EQ(tp.calls[1].arguments.dump(), R"({"tags":["a","b"],"text":"line one\nline two"})");
  // Without schemas: JSON where the value is a number, object, array, boolean or null.
  tp = parse_tool_calls(two_calls(), nullptr);
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"city":"Paris","days":3,"zip":75001})");
}

// M3's form: each parameter named by its own tag (as ATOM's parser reads it and the bundled
// model's template renders it); a '<' that opens no parameter tag is text between them.
TEST(ToolCalls, ParametersNamedByTheirTags) {
  const std::string text = "Sure.\n" + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">\n" + NS +
                           "<city>Paris" + NS + "</city>\n" + NS + "<days>3" + NS + "</days>\n < 2 \n" + NS +
                           "<zip>a<b>c" + NS + "</zip>\n" + NS + "</invoke>\n" + NS + "<invoke name=\"note\">\n" + NS +
                           "<tags>[\"a\"]" + NS + "</tags>\n" + NS + "<parameter name=\"text\">hi" + NS +
                           "</parameter>\n" + NS + "</invoke>\n" + NS + "</tool_call>";
  ToolCallParse tp = parse_tool_calls(text, kTools);
  EXPECT_EQ(tp.content, "Sure.\n");
  ASSERT_EQ(tp.calls.size(), 2u);
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"city":"Paris","days":3,"zip":"a<b>c"})");
  EXPECT_EQ(tp.calls[1].arguments.dump(), R"({"tags":["a"],"text":"hi"})");
  // Streamed in pieces cut anywhere, the pieces add up to the same arguments.
  for (size_t i = 0; i <= text.size(); ++i) {
    ToolCallStream s;
    std::string args[2];
    for (std::string_view part : {std::string_view(text).substr(0, i), std::string_view(text).substr(i)}) {
      s.push(part);
      for (const ToolCallDelta& d : s.take_calls(kTools, false)) args[d.index] += d.arguments;
    }
    for (const ToolCallDelta& d : s.take_calls(kTools, true)) args[d.index] += d.arguments;
    EXPECT_EQ(args[0], tp.calls[0].arguments.dump()) << i;
    EXPECT_EQ(args[1], tp.calls[1].arguments.dump()) << i;
  }
}

// What the bundled model's chat template renders for an assistant turn's tool_calls parses back
// to them.
TEST(ToolCalls, RoundTripThroughTheBundledModelsTemplate) {
  const std::string dir = std::string(SIEVE_SOURCE_DIR) + "/models/minimax-m3-tiny";
  if (!std::filesystem::exists(dir + "/chat_template.jinja")) GTEST_SKIP() << "no bundled model";
  const text::Tokenizer tok = text::Tokenizer::load(dir);
  const ojson messages = ojson::parse(R"([{"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "Checking.", "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2, "zip": "0150"}}},
      {"id": "c2", "type": "function", "function": {"name": "note", "arguments": {"tags": ["x"], "text": "hi"}}}]}])");
  const std::string prompt = text::render_chat(tok, messages, kTools, false, ojson::object());
  const size_t from = prompt.rfind("]~b]ai\n") + 7, to = prompt.rfind("[e~[");
  ToolCallParse tp = parse_tool_calls(std::string_view(prompt).substr(from, to - from), kTools);
  ASSERT_EQ(tp.calls.size(), 2u) << prompt;
  EXPECT_EQ(tp.calls[0].name, "get_weather");
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"city":"Oslo","days":2,"zip":"0150"})") << prompt;
  EXPECT_EQ(tp.calls[1].arguments.dump(), R"({"tags":["x"],"text":"hi"})");
}

// tool_choice's grammar: the calls as the template writes them, typed by the tools' schemas.
TEST(ToolCalls, ForcedCallGrammarFollowsTheSchemas) {
  const guided::testing::ByteWalk bytes;
  const auto& vocab = bytes.vocab;
  // 1: complete; 0: a prefix; -1: some byte is masked.
  auto walk = [&](const std::shared_ptr<const guided::OutputConstraint>& c, const std::string& text) {
    return bytes.walk(c, text);
  };
  const ojson tools = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]},
      "when": {"type": ["number", "null"]}, "opts": {"type": "object"}, "odd key": {"type": "boolean"}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping"}}])");
  const std::string g = tool_call_grammar({"get_weather"}, tools, false);
  auto one = guided::grammar_constraint(vocab, g);
  auto call = [&](const std::string& params) {
    return NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">\n" + params + NS + "</invoke>\n" + NS + "</tool_call>";
  };
  auto p = [&](const std::string& k, const std::string& v) { return NS + "<" + k + ">" + v + NS + "</" + k + ">\n"; };
  const std::string full = call(p("city", "Paris <3") + p("days", "-2") + p("unit", "f") + p("when", "1.5e3") +
                                p("opts", R"({"a": [1, "x\n"], "b": null})") + NS +
                                "<parameter name=\"odd key\">true" + NS + "</parameter>\n");
  EXPECT_EQ(walk(one, full), 1) << g;
  ToolCallParse tp = parse_tool_calls(full, tools);
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].arguments.dump(),
            R"({"city":"Paris <3","days":-2,"unit":"f","when":1500.0,"opts":{"a":[1,"x\n"],"b":null},"odd key":true})");
  EXPECT_EQ(walk(one, call(p("city", "Oslo") + p("when", "null"))), 1);
  EXPECT_EQ(walk(one, call(p("days", "2"))), -1);                    // city is required
  EXPECT_EQ(walk(one, call(p("city", "Oslo") + p("days", "2.5"))), -1);  // an integer
  EXPECT_EQ(walk(one, call(p("city", "Oslo") + p("unit", "k"))), -1);    // enum
  EXPECT_EQ(walk(one, call(p("city", "Oslo") + p("opts", "[1]"))), -1);  // an object
  EXPECT_EQ(walk(one, call(p("days", "2") + p("city", "Oslo"))), -1);    // declared order
  EXPECT_EQ(walk(one, call(p("city", "a</b>"))), -1);                   // text has no "</"
  EXPECT_EQ(walk(one, call(p("city", "Oslo")) + "x"), -1);               // nothing after the block
  EXPECT_EQ(walk(one, full.substr(0, full.size() / 2)), 0);
  // "required": one call or more, of any of the tools; a tool without parameters takes any tags.
  auto several = guided::grammar_constraint(vocab, tool_call_grammar({"get_weather", "ping"}, tools, true));
  const std::string ping = NS + "<invoke name=\"ping\">\n" + NS + "<host>a.b" + NS + "</host>\n" + NS + "</invoke>\n";
  const std::string two = NS + "<tool_call>\n" + ping + NS + "<invoke name=\"get_weather\">\n" + p("city", "Rome") + NS +
                          "</invoke>\n" + NS + "</tool_call>";
  EXPECT_EQ(walk(several, two), 1);
  EXPECT_EQ(parse_tool_calls(two, tools).calls.size(), 2u);
  EXPECT_EQ(walk(one, two), -1);  // a named function: that one, once
}

TEST(ToolCalls, NoCallsCutShortAndM2Opening) {
  EXPECT_TRUE(parse_tool_calls("just text <tool", kTools).calls.empty());
  EXPECT_EQ(parse_tool_calls("just text <tool", kTools).content, "just text <tool");
  const std::string cut = two_calls().substr(0, two_calls().find("</invoke>"));
  ToolCallParse tp = parse_tool_calls(cut, kTools);
  EXPECT_TRUE(tp.calls.empty());
  EXPECT_EQ(tp.content, cut);  // a call cut short stays text
  tp = parse_tool_calls("<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"x\">1</parameter>\n</invoke>\n"
                        "</minimax:tool_call>",
                        nullptr);
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].name, "f");
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"x":1})");
  EXPECT_EQ(tp.content, "");
}

// What the built-in chat template renders for an assistant turn's tool_calls parses back to them.
TEST(ToolCalls, RoundTripThroughTheChatTemplate) {
  const auto dir = std::filesystem::temp_directory_path() / ("sieve-tool-calls-test-" + std::to_string(::getpid()));
  text::write_byte_level_tokenizer(dir.string(), 300);
  const text::Tokenizer tok = text::Tokenizer::load(dir.string());
  const ojson messages = ojson::parse(R"([{"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "Checking.", "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2, \"zip\": \"0150\"}"}},
      {"id": "c2", "type": "function", "function": {"name": "note", "arguments": {"tags": ["x"], "text": "hi"}}}]}])");
  const std::string prompt = text::render_chat(tok, messages, kTools, false, ojson::object());
  const size_t from = prompt.rfind("]~b]ai\n") + 7, to = prompt.rfind("[e~[");
  ToolCallParse tp = parse_tool_calls(std::string_view(prompt).substr(from, to - from), kTools);
  EXPECT_EQ(tp.content, "Checking.\n");
  ASSERT_EQ(tp.calls.size(), 2u) << prompt;
  EXPECT_EQ(tp.calls[0].name, "get_weather");
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"city":"Oslo","days":2,"zip":"0150"})");
  EXPECT_EQ(tp.calls[1].arguments.dump(), R"({"tags":["x"],"text":"hi"})");
  std::filesystem::remove_all(dir);
}

// Streamed in two pieces cut anywhere: the content before the opening goes out (none of the
// tool-call text does), and the calls come whole at the end.
TEST(ToolCalls, StreamCutAnywhere) {
  const std::string text = two_calls();
  for (size_t i = 0; i <= text.size(); ++i) {
    ToolCallStream s;
    std::string content = s.push(std::string_view(text).substr(0, i));
    content += s.push(std::string_view(text).substr(i));
    ToolCallParse tp = s.finish(kTools);
    content += tp.content;
    EXPECT_EQ(content, "Let me check.\n") << i;
    EXPECT_EQ(tp.calls.size(), 2u) << i;
  }
  const std::string plain = "a ]<]mini b <tool_c d";
  for (size_t i = 0; i <= plain.size(); ++i) {
    ToolCallStream s;
    std::string content = s.push(std::string_view(plain).substr(0, i));
    content += s.push(std::string_view(plain).substr(i));
    ToolCallParse tp = s.finish(kTools);
    EXPECT_EQ(content + tp.content, plain) << i;
    EXPECT_TRUE(tp.calls.empty());
  }
}

// The calls streamed in pieces, the text cut into three pieces anywhere: the content before the
// opening goes out; each call's first piece names it; its pieces' arguments add up to the
// non-streamed call's arguments; the calls are numbered in order.
TEST(ToolCalls, StreamedPiecesAddUpToTheCalls) {
  const std::string text = two_calls();
  const ToolCallParse whole = parse_tool_calls(text, kTools);
  ASSERT_EQ(whole.calls.size(), 2u);
  for (size_t i = 0; i <= text.size(); i += 3) {
    for (size_t j = i; j <= text.size(); j += 7) {
      ToolCallStream s;
      std::string content;
      std::vector<std::string> names, args;
      auto take = [&](bool at_end) {
        for (const ToolCallDelta& d : s.take_calls(kTools, at_end)) {
          if (size_t(d.index) == names.size()) {
            EXPECT_TRUE(d.first) << i << " " << j;
            EXPECT_FALSE(d.name.empty()) << i << " " << j;
            names.push_back(d.name);
            args.emplace_back();
          } else {
            ASSERT_LT(size_t(d.index), names.size()) << i << " " << j;
            EXPECT_FALSE(d.first) << i << " " << j;
            EXPECT_TRUE(d.name.empty()) << i << " " << j;
          }
          args[size_t(d.index)] += d.arguments;
        }
      };
      for (auto [from, to] : {std::pair{size_t(0), i}, std::pair{i, j}, std::pair{j, text.size()}}) {
        content += s.push(std::string_view(text).substr(from, to - from));
        take(false);
      }
      take(true);
      content += s.finish_content(s.calls_begun());
      EXPECT_EQ(content, "Let me check.\n") << i << " " << j;
      ASSERT_EQ(names.size(), 2u) << i << " " << j;
      for (size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(names[k], whole.calls[k].name);
        EXPECT_EQ(args[k], whole.calls[k].arguments.dump()) << i << " " << j;
      }
    }
  }
}

// A stream cut short: the calls begun are closed as they stand (their complete parameters); a
// tool-call block with no complete invoke tag stays content.
TEST(ToolCalls, StreamCutShort) {
  const std::string text = two_calls();
  const size_t second = text.find("<parameter name=\"text\">");
  ToolCallStream s;
  EXPECT_EQ(s.push(text.substr(0, second)), "Let me check.\n");
  std::vector<ToolCallDelta> d = s.take_calls(kTools, true);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].arguments, R"({"city":"Paris","days":3,"zip":"75001"})");
  EXPECT_EQ(d[1].name, "note");
  EXPECT_EQ(d[1].arguments, R"({"tags":["a","b"]})");
  EXPECT_TRUE(s.calls_begun());
  EXPECT_EQ(s.finish_content(true), "");

  const std::string cut = "Hi " + NS + "<tool_call>\n" + NS + "<invoke name=\"get_wea";
  ToolCallStream t;
  std::string content = t.push(cut);
  EXPECT_TRUE(t.take_calls(kTools, true).empty());
  EXPECT_FALSE(t.calls_begun());
  EXPECT_EQ(content + t.finish_content(false), cut);
  // An invoke with no parameters streams "{}".
  ToolCallStream u;
  u.push(NS + "<tool_call>\n" + NS + "<invoke name=\"ping\">\n" + NS + "</invoke>");
  d = u.take_calls(nullptr, false);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].name, "ping");
  EXPECT_EQ(d[0].arguments, "{}");
}

}  // namespace
}  // namespace sieve::server
