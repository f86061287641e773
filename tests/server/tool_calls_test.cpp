// The tool-call parsers of --tool-call-parser: MiniMax-M3's namespaced calls with nested arguments
// (the spec's example verbatim, values typed by the request's schemas, malformed blocks, streaming
// cut at every byte), MiniMax-M2's form, the forced-call grammars, and round trips through the
// chat templates.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "../guided/byte_walk.h"
#include "guided/guided.h"
#include "server/reasoning.h"
#include "text/byte_level.h"
#include "text/chat_template.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace sieve::server {
namespace {

using ojson = nlohmann::ordered_json;

const std::string NS = "]<]minimax[>[";

// Spec section 7's example, verbatim (vLLM's m3_text.py).
const std::string kSpecExample =
    "]<]minimax[>[<tool_call>\n"
    "]<]minimax[>[<invoke name=\"func1\">]<]minimax[>[<p1>value1]<]minimax[>[</p1>]<]minimax[>[<p2>]<]minimax[>[<item>"
    "]<]minimax[>[<k>val]<]minimax[>[</k>]<]minimax[>[</item>]<]minimax[>[</p2>]<]minimax[>[</invoke>\n"
    "]<]minimax[>[</tool_call>";

// An element: NS<tag>body NS</tag>.
std::string el(const std::string& tag, const std::string& body) {
  return NS + "<" + tag + ">" + body + NS + "</" + tag + ">";
}
std::string invoke(const std::string& name, const std::string& params) {
  return NS + "<invoke name=\"" + name + "\">" + params + NS + "</invoke>";
}
std::string block(const std::string& invokes) {
  return NS + "<tool_call>\n" + invokes + "\n" + NS + "</tool_call>";
}

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
    "temp": {"type": "number"}, "metric": {"type": "boolean"}, "note": {"type": ["string", "null"]},
    "gone": {"type": "null"},
    "where": {"type": "object", "properties": {"lat": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}}},
    "hours": {"type": "array", "items": {"type": "integer"}},
    "stops": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}}},
    "required": ["city"]}}},
  {"type": "function", "function": {"name": "note", "parameters": {"type": "object", "properties": {
    "tags": {"type": "array"}, "text": {"type": "string"}}}}}])");

// The calls of `text` streamed in pieces cut at `cuts`: the content that went out, each call's
// name and its arguments pieces joined; the deltas checked as OpenAI numbers them.
struct Streamed {
  std::string content;
  std::vector<std::string> names, args;
};
Streamed stream(const std::string& text, const ojson& tools, const std::vector<size_t>& cuts,
                const std::string& parser = "minimax_m3") {
  ToolCallStream s(parser);
  Streamed out;
  auto take = [&](bool at_end) {
    for (const ToolCallDelta& d : s.take_calls(tools, at_end)) {
      if (size_t(d.index) == out.names.size()) {
        EXPECT_TRUE(d.first);
        out.names.push_back(d.name);
        out.args.emplace_back();
      } else {
        EXPECT_LT(size_t(d.index), out.names.size());
        EXPECT_FALSE(d.first);
        EXPECT_TRUE(d.name.empty());
        if (size_t(d.index) >= out.names.size()) continue;
      }
      out.args[size_t(d.index)] += d.arguments;
    }
  };
  size_t at = 0;
  for (size_t c : cuts) {
    out.content += s.push(std::string_view(text).substr(at, c - at));
    take(false);
    at = c;
  }
  out.content += s.push(std::string_view(text).substr(at));
  take(false);
  take(true);
  out.content += s.finish_content(s.calls_begun());
  return out;
}

TEST(ToolCallsM3, SpecExampleVerbatim) {
  ToolCallParse tp = parse_tool_calls(kSpecExample, nullptr);
  EXPECT_EQ(tp.content, "");
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].name, "func1");
  EXPECT_EQ(tp.calls[0].arguments, ojson::parse(R"({"p1": "value1", "p2": [{"k": "val"}]})"));
  // With content before it, and a schema that says p2 is an array of objects.
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "func1", "parameters": {
    "type": "object", "properties": {"p1": {"type": "string"}, "p2": {"type": "array", "items": {"type": "object"}}}}}}])");
  tp = parse_tool_calls("Sure.\n" + kSpecExample, tools);
  EXPECT_EQ(tp.content, "Sure.");
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"p1":"value1","p2":[{"k":"val"}]})");
}

// The spec's example cut at every byte (and at every pair of bytes 5 apart): the content, the
// name and the arguments' pieces add up to what the whole text gives.
TEST(ToolCallsM3, SpecExampleStreamedCutAtEveryByte) {
  const std::string text = "Let me look.\n" + kSpecExample;
  const ToolCallParse whole = parse_tool_calls(text, nullptr);
  ASSERT_EQ(whole.calls.size(), 1u);
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j : {i, std::min(text.size(), i + 5)}) {
      Streamed s = stream(text, nullptr, {i, j});
      EXPECT_EQ(s.content, "Let me look.") << i << " " << j;
      ASSERT_EQ(s.names.size(), 1u) << i << " " << j;
      EXPECT_EQ(s.names[0], "func1");
      EXPECT_EQ(s.args[0], whole.calls[0].arguments.dump()) << i << " " << j;
    }
  }
}

// Every type of the schema, nested objects and arrays, repeated tags, entities, newlines between
// tags or none.
TEST(ToolCallsM3, ValuesTypedBySchema) {
  const std::string params =
      el("city", "Paris &amp; &lt;Lyon&gt; &#233;&#x1F600;") + "\n" + el("days", "3") + el("zip", "075") +
      el("temp", "-1.5e2") + el("metric", "true") + el("note", "null") + el("gone", "null") +
      el("where", el("lat", "48.8") + el("tags", el("item", "a") + "\n" + el("item", "b"))) +
      el("hours", el("item", "1") + el("item", "2")) +
      el("stops", el("item", el("name", "x") + el("n", "1")) + el("item", el("name", "y"))) + el("extra", "42");
  const ToolCallParse tp = parse_tool_calls(block(invoke("get_weather", params)), kTools);
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].arguments, ojson::parse(R"({"city": "Paris & <Lyon> é😀", "days": 3, "zip": "075",
    "temp": -150.0, "metric": true, "note": "null", "gone": null,
    "where": {"lat": 48.8, "tags": ["a", "b"]}, "hours": [1, 2],
    "stops": [{"name": "x", "n": 1}, {"name": "y"}], "extra": "42"})"));
  // Repeated tags are an array; an object's child named item stays an object where the schema
  // says so; empty values of object and array types are {} and [].
  const ojson tools = ojson::parse(R"([{"name": "f", "parameters": {"type": "object", "properties": {
    "o": {"type": "object"}, "a": {"type": "array"}, "e": {"type": "object"}, "l": {"type": "array"}}}}])");
  const ToolCallParse r = parse_tool_calls(
      block(invoke("f", el("o", el("item", "1")) + el("a", el("x", "1") + el("x", "2")) + el("e", "") + el("l", "") +
                            el("r", "1") + el("r", "2"))),
      tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments,
            ojson::parse(R"({"o": {"item": "1"}, "a": {"x": ["1", "2"]}, "e": {}, "l": [], "r": ["1", "2"]})"));
  // Values that do not fit their type stay text; an integer param written as a float stays text.
  const ToolCallParse bad = parse_tool_calls(block(invoke("get_weather", el("days", "2.5") + el("metric", "maybe"))), kTools);
  ASSERT_EQ(bad.calls.size(), 1u);
  EXPECT_EQ(bad.calls[0].arguments, ojson::parse(R"({"days": "2.5", "metric": "maybe"})"));
}

// Several invokes in one block, several blocks, text around them; the old M2 forms and a bare
// <tool_call> are text for minimax_m3.
TEST(ToolCallsM3, BlocksInvokesAndWhatIsNotACall) {
  const std::string text = "A\n" + block(invoke("note", el("text", "1")) + "\n" + invoke("note", "")) + "\nB " +
                           block(invoke("get_weather", el("city", "Rome")));
  ToolCallParse tp = parse_tool_calls(text, kTools);
  EXPECT_EQ(tp.content, "A\nB");
  ASSERT_EQ(tp.calls.size(), 3u);
  EXPECT_EQ(tp.calls[1].arguments, ojson::object());
  EXPECT_EQ(tp.calls[2].arguments, ojson::parse(R"({"city": "Rome"})"));
  for (const std::string& plain : std::vector<std::string>{std::string("<tool_call>\n<invoke name=\"note\"><text>1</text></invoke>\n</tool_call>"),
        std::string("<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"x\">1</parameter>\n</invoke>\n"
                    "</minimax:tool_call>"),
        "x " + NS + "tool_call> y", "a ]<]mini b"}) {
    tp = parse_tool_calls(plain, kTools);
    EXPECT_TRUE(tp.calls.empty()) << plain;
    EXPECT_EQ(tp.content, plain);
  }
}

// Malformed blocks are content, with no call; unknown tools and parameters are calls with text
// values; deep nesting is refused in time.
TEST(ToolCallsM3, MalformedInputsHaveAClearOutcome) {
  const std::vector<std::string> broken = {
      block(invoke("note", el("text", "a") + NS + "<b>x" + NS + "</c>")),       // mismatched closing tag
      block(invoke("note", el("text", "a")) + " stray"),                        // text between invokes
      block(invoke("note", el("text", std::string(1, 'a') + el("b", "c")))),    // text beside elements
      block(NS + "<invoke name=\"note\">" + "]<]mini<text>a" + NS + "</invoke>"),  // namespace token cut
      block(NS + "<invoke nam=\"note\">" + NS + "</invoke>"),                   // not an invoke
      block(invoke("note", NS + "</text>")),                                    // closing what is not open
      block(""),                                                                // no invoke
  };
  for (const std::string& b : broken) {
    const std::string text = "Before. " + b + " After.";
    ToolCallParse tp = parse_tool_calls(text, kTools);
    EXPECT_TRUE(tp.calls.empty()) << b;
    EXPECT_EQ(tp.content, text) << b;
    Streamed s = stream(text, kTools, {});  // the block breaks before any call went out
    EXPECT_TRUE(s.names.empty()) << b;
    EXPECT_EQ(s.content, text) << b;
  }
  // Streamed, a call that went out before its block broke stays, closed as it stands; the rest
  // of the block is dropped, and what follows it is content.
  const std::string late = "A " + block(invoke("note", el("text", "a")) + "\n" + invoke("note", "oops")) + " B";
  Streamed s = stream(late, kTools, {late.find(NS + "<invoke name=\"note\">oops")});
  EXPECT_EQ(s.names, std::vector<std::string>{"note"});
  EXPECT_EQ(s.args[0], R"({"text":"a"})");
  EXPECT_EQ(s.content, "A B");
  // Unclosed: a block cut anywhere keeps the invokes it completed, else it is content.
  const std::string full = block(invoke("note", el("text", "a")) + "\n" + invoke("get_weather", el("city", "b")));
  for (size_t i = 0; i <= full.size(); ++i) {
    const std::string cut = "x " + full.substr(0, i);
    ToolCallParse tp = parse_tool_calls(cut, kTools);
    const size_t complete = cut.find(NS + "</invoke>") == std::string::npos ? 0
                            : cut.rfind(NS + "</invoke>") == cut.find(NS + "</invoke>") ? 1 : 2;
    EXPECT_EQ(tp.calls.size(), complete) << i;
    EXPECT_EQ(tp.content, complete ? "x" : cut) << i;
  }
  // Unknown tools and parameters: calls with untyped values (text, or elements).
  ToolCallParse tp = parse_tool_calls(block(invoke("nope", el("n", "1") + el("o", el("k", "2")))), kTools);
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].name, "nope");
  EXPECT_EQ(tp.calls[0].arguments, ojson::parse(R"({"n": "1", "o": {"k": "2"}})"));
  tp = parse_tool_calls(block(invoke("get_weather", el("city", "X") + el("zzz", "true"))), kTools);
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].arguments, ojson::parse(R"({"city": "X", "zzz": "true"})"));
  // 10,000 levels of nesting: content, streamed or not, in linear time.
  std::string deep, closing;
  for (int i = 0; i < 10000; ++i) {
    deep += NS + "<a>";
    closing = NS + "</a>" + closing;
  }
  const std::string text = block(invoke("note", el("text", deep + "x" + closing)));
  tp = parse_tool_calls(text, kTools);
  EXPECT_TRUE(tp.calls.empty());
  EXPECT_EQ(tp.content, text);
  s = stream(text, kTools, {text.size() / 2});
  EXPECT_TRUE(s.names.empty());
  EXPECT_EQ(s.content, text);
  // 64 levels are fine.
  std::string ok = "x";
  for (int i = 0; i < 62; ++i) ok = el("a", ok);
  EXPECT_EQ(parse_tool_calls(block(invoke("note", el("tags", ok))), kTools).calls.size(), 1u);
}

// Streaming as the peers stream: the name first (with nothing else), a string value as its text
// arrives, other values when they close, and "}" at </invoke>.
TEST(ToolCallsM3, StreamsNameFirstScalarsAsTheyArriveNestedWhenComplete) {
  ToolCallStream s;
  EXPECT_EQ(s.push("Hi " + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">"), "Hi");
  auto d = s.take_calls(kTools, false);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].first);
  EXPECT_EQ(d[0].name, "get_weather");
  EXPECT_EQ(d[0].arguments, "");
  s.push(NS + "<city>Par");
  d = s.take_calls(kTools, false);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].arguments, R"({"city":"Par)");
  s.push("is &am");  // an entity held back until it is whole
  EXPECT_EQ(s.take_calls(kTools, false)[0].arguments, "is ");
  s.push("p; \"x\"" + NS + "</ci");
  EXPECT_EQ(s.take_calls(kTools, false)[0].arguments, R"(& \"x\")");
  s.push("ty>" + NS + "<days>1");
  EXPECT_EQ(s.take_calls(kTools, false)[0].arguments, R"(","days":)");
  s.push("2" + NS + "</days>" + NS + "<where>" + el("lat", "1"));
  EXPECT_EQ(s.take_calls(kTools, false)[0].arguments, "12,\"where\":");
  s.push(NS + "</where>");
  EXPECT_EQ(s.take_calls(kTools, false)[0].arguments, R"({"lat":1})");
  s.push(NS + "</invoke>\n" + NS + "</tool_call>");
  EXPECT_EQ(s.take_calls(kTools, false)[0].arguments, "}");
  EXPECT_TRUE(s.calls_begun());
  EXPECT_EQ(s.finish_content(true), "");
  // Cut short: the call is closed as it stands (an open string closed, a value not come null).
  for (const auto& [text, args] : std::vector<std::pair<std::string, std::string>>{
           {el("city", "Oslo") + NS + "<days>4", R"({"city":"Oslo","days":null})"},
           {NS + "<city>Os", R"({"city":"Os"})"},
           {"", "{}"}}) {
    ToolCallStream c;
    c.push(NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">" + text);
    std::string got;
    for (const ToolCallDelta& x : c.take_calls(kTools, true)) got += x.arguments;
    EXPECT_EQ(got, args) << text;
    EXPECT_TRUE(ojson::parse(got, nullptr, false).is_object());
  }
}

// A realistic call cut into three pieces anywhere: the pieces add up to the full response's
// arguments.
TEST(ToolCallsM3, StreamedPiecesAddUpToTheCalls) {
  const std::string text =
      "Checking both.\n" +
      block(invoke("get_weather", el("city", "Z&#252;rich") + el("where", el("tags", el("item", "a"))) + el("days", "2") +
                                      el("hours", el("item", "7"))) +
            "\n" + invoke("note", el("text", "line one\nline two") + el("tags", el("item", "x"))));
  const ToolCallParse whole = parse_tool_calls(text, kTools);
  ASSERT_EQ(whole.calls.size(), 2u);
  for (size_t i = 0; i <= text.size(); i += 2)
    for (size_t j = i; j <= text.size(); j += 9) {
      Streamed s = stream(text, kTools, {i, j});
      EXPECT_EQ(s.content, "Checking both.") << i << " " << j;
      ASSERT_EQ(s.names.size(), 2u) << i << " " << j;
      for (size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(s.names[k], whole.calls[k].name);
        EXPECT_EQ(s.args[k], whole.calls[k].arguments.dump()) << i << " " << j;
      }
    }
}

TEST(ToolCallsM2, KeepsItsForm) {
  const std::string text =
      "Let me check.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
      "<parameter name=\"days\">3</parameter>\n<parameter name=\"zip\">75001</parameter>\n</invoke>\n"
      "<invoke name=\"note\">\n<parameter name=\"tags\">[\"a\", \"b\"]</parameter>\n<parameter name=\"text\">\nline "
      "one\n</parameter>\n</invoke>\n</minimax:tool_call>";
  ToolCallParse tp = parse_tool_calls(text, kTools, "minimax_m2");
  EXPECT_EQ(tp.content, "Let me check.\n");
  ASSERT_EQ(tp.calls.size(), 2u);
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"city":"Paris","days":3,"zip":"75001"})");
  EXPECT_EQ(tp.calls[1].arguments.dump(), R"({"tags":["a","b"],"text":"line one"})");
  tp = parse_tool_calls(text, nullptr, "minimax_m2");  // without schemas: JSON where it parses
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"city":"Paris","days":3,"zip":75001})");
  EXPECT_TRUE(parse_tool_calls(kSpecExample, nullptr, "minimax_m2").calls.empty());
  for (size_t i = 0; i <= text.size(); i += 3) {
    Streamed s = stream(text, kTools, {i}, "minimax_m2");
    EXPECT_EQ(s.content, "Let me check.\n") << i;
    ASSERT_EQ(s.names.size(), 2u) << i;
    EXPECT_EQ(s.args[1], tp.calls[1].arguments.dump()) << i;
  }
}

// tool_choice's grammar: exactly the template's form, values of the schemas' types.
TEST(ToolCallsGrammar, M3ForcedCallsFollowTheTemplatesForm) {
  const guided::testing::ByteWalk bytes;
  auto walk = [&](const std::string& g, const std::string& text) {
    return bytes.walk(guided::grammar_constraint(bytes.vocab, g), text);
  };
  const std::string one = tool_call_grammar({"get_weather"}, kTools, false);
  const std::string good =
      block(invoke("get_weather", el("city", "Paris <3 ] x") + el("days", "-2") + el("temp", "1.5e3") +
                                      el("where", el("lat", "1") + el("tags", el("item", "a") + el("item", "b"))) +
                                      el("stops", el("item", el("name", "s") + el("n", "4")))));
  EXPECT_EQ(walk(one, good), 1) << one;
  ToolCallParse tp = parse_tool_calls(good, kTools);
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].arguments, ojson::parse(R"({"city": "Paris <3 ] x", "days": -2, "temp": 1500.0,
    "where": {"lat": 1, "tags": ["a", "b"]}, "stops": [{"name": "s", "n": 4}]})"));
  auto call = [&](const std::string& params) { return block(invoke("get_weather", params)); };
  EXPECT_EQ(walk(one, call(el("city", "Oslo") + el("metric", "false"))), 1);
  EXPECT_EQ(walk(one, call(el("days", "2"))), -1);                               // city is required
  EXPECT_EQ(walk(one, call(el("city", "Oslo") + el("days", "2.5"))), -1);         // an integer
  EXPECT_EQ(walk(one, call(el("days", "2") + el("city", "Oslo"))), -1);           // declared order
  EXPECT_EQ(walk(one, call(el("city", "a" + NS + "x"))), -1);                     // text has no token
  EXPECT_EQ(walk(one, call(el("city", "Oslo") + el("where", "{\"lat\": 1}"))), -1);  // tags, not JSON
  EXPECT_EQ(walk(one, call(el("city", "Oslo") + el("gone", "null"))), -1);        // null-only: left out
  EXPECT_EQ(walk(one, call(el("city", "Oslo") + el("zzz", "1"))), -1);            // undeclared
  const std::string newline_after_invoke_tag = invoke("get_weather", std::string(1, '\n') + el("city", "x"));
  EXPECT_EQ(walk(one, block(newline_after_invoke_tag)), -1);  // no newline the template does not write
  EXPECT_EQ(walk(one, call(el("city", "Oslo")) + "x"), -1);
  EXPECT_EQ(walk(one, good.substr(0, good.size() / 2)), 0);
  // "required": one call or more of any of the tools; enums, and tools without a schema.
  const ojson tools = ojson::parse(R"([{"name": "set", "parameters": {"type": "object", "properties": {
    "mode": {"enum": ["on", "off", 3, true]}}, "required": ["mode"]}}, {"name": "ping"}])");
  const std::string several = tool_call_grammar({"set", "ping"}, tools, true);
  const std::string two = block(invoke("ping", el("host", el("name", "a.b"))) + "\n" + invoke("set", el("mode", "3")));
  EXPECT_EQ(walk(several, two), 1) << several;
  EXPECT_EQ(parse_tool_calls(two, tools).calls.size(), 2u);
  EXPECT_EQ(walk(several, block(invoke("set", el("mode", "true")))), 1);
  EXPECT_EQ(walk(several, block(invoke("set", el("mode", "of")))), -1);
  EXPECT_EQ(walk(tool_call_grammar({"set"}, tools, false), two), -1);  // a named function: that one, once
}

TEST(ToolCallsGrammar, M2FormAsBefore) {
  const guided::testing::ByteWalk bytes;
  const std::string g = tool_call_grammar({"get_weather"}, kTools, false, "minimax_m2");
  const std::string text = "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Rome</parameter>\n"
                           "<parameter name=\"where\">{\"lat\": 1}</parameter>\n</invoke>\n</minimax:tool_call>";
  EXPECT_EQ(bytes.walk(guided::grammar_constraint(bytes.vocab, g), text), 1) << g;
  ToolCallParse tp = parse_tool_calls(text, kTools, "minimax_m2");
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].arguments.dump(), R"({"city":"Rome","where":{"lat":1}})");
}

// The special tokens the parsers need stay in the text under skip_special_tokens.
TEST(ToolCalls, MarkerTokensSurviveSkipSpecialTokens) {
  const auto dir = std::filesystem::temp_directory_path() / ("sieve-tool-markers-" + std::to_string(::getpid()));
  text::write_byte_level_tokenizer(dir.string(), 300);
  const text::Tokenizer tok = text::Tokenizer::load(dir.string());
  const std::vector<int32_t> ids = parser_marker_ids(tok, "minimax_m3", "minimax_m3");
  ASSERT_EQ(ids, std::vector<int32_t>{*tok.token_to_id(NS)});  // the one special marker there
  EXPECT_TRUE(parser_marker_ids(tok, "", "").empty());
  const std::vector<int32_t> text = tok.encode(kSpecExample + "[e~[", false);
  text::StreamDecoder plain(tok, true), kept(tok, true, ids);
  std::string a, b;
  for (int32_t id : text) {
    a += plain.push(id);
    b += kept.push(id);
  }
  EXPECT_EQ(a.find(NS), std::string::npos);
  EXPECT_EQ(b, kSpecExample);
  EXPECT_EQ(parse_tool_calls(b, nullptr).calls.size(), 1u);
  std::filesystem::remove_all(dir);
}

// A conversation rendered by a template, each assistant turn fed to the reasoning and tool-call
// parsers, comes back as the same messages.
void expect_round_trip(const text::Tokenizer& tok, const std::string& mode) {
  const ojson messages = ojson::parse(R"([
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "Weather in Zürich, and plan stops?"},
    {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool, twice.",
     "tool_calls": [
       {"id": "c1", "type": "function", "function": {"name": "get_weather",
        "arguments": "{\"city\": \"Zürich\", \"days\": 2, \"metric\": true, \"where\": {\"lat\": 47.4, \"tags\": [\"lake\", \"old town\"]}, \"stops\": [{\"name\": \"a\", \"n\": 1}, {\"name\": \"b\", \"n\": 2}]}"}},
       {"id": "c2", "type": "function", "function": {"name": "note", "arguments": {"text": "line 1\nline 2", "tags": []}}}]},
    {"role": "tool", "content": "{\"temp\": 18}"},
    {"role": "tool", "content": "saved"},
    {"role": "assistant", "content": "It is 18°C; stops a then b.", "reasoning_content": "Summarize."},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "You are welcome."}])");
  const ReasoningFormat& f = reasoning_format("minimax_m3");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    const ojson before(messages.begin(), messages.begin() + ojson::difference_type(i));
    const std::string prompt = text::render_chat(tok, before, kTools, true, {{"thinking_mode", mode}});
    const std::string full = text::render_chat(tok, ojson(messages.begin(), messages.begin() + ojson::difference_type(i + 1)),
                                               kTools, false, {{"thinking_mode", mode}});
    // The turn as the model would have written it after the generation prompt.
    const size_t turn = prompt.rfind("]~b]ai\n") + 7;
    ASSERT_EQ(full.compare(0, turn, prompt, 0, turn), 0) << full;
    std::string out = full.substr(turn);
    out = out.substr(0, out.rfind("[e~["));
    if (prompt.ends_with(f.open)) {
      if (!out.starts_with(f.open)) continue;  // a turn without reasoning cannot follow an enabled prompt
      out = out.substr(f.open.size());
    } else if (prompt.ends_with(f.close)) {
      if (!out.starts_with(f.close)) continue;  // a turn with reasoning cannot follow a disabled prompt
      out = out.substr(f.close.size());
    }
    ReasoningSplitter split(f, prompt_opens_reasoning(f, prompt));
    ReasoningSplitter::Piece p = split.push(out), rest = split.finish();
    const ToolCallParse tp = parse_tool_calls(p.content + rest.content, kTools);
    ojson back = {{"role", "assistant"}, {"content", tp.content}};
    if (!(p.reasoning + rest.reasoning).empty()) back["reasoning_content"] = p.reasoning + rest.reasoning;
    ojson want = {{"role", "assistant"}, {"content", messages[i]["content"]}};
    if (messages[i].contains("reasoning_content")) want["reasoning_content"] = messages[i]["reasoning_content"];
    if (!tp.calls.empty()) {
      back["tool_calls"] = ojson::array();
      for (const ParsedToolCall& c : tp.calls) back["tool_calls"].push_back({{"name", c.name}, {"arguments", c.arguments}});
      want["tool_calls"] = ojson::array();
      for (const ojson& c : messages[i]["tool_calls"]) {
        const ojson& a = c["function"]["arguments"];
        want["tool_calls"].push_back({{"name", c["function"]["name"]}, {"arguments", a.is_string() ? ojson::parse(a.get<std::string>()) : a}});
      }
    }
    EXPECT_EQ(back, want) << mode << " turn " << i << ":\n" << out;
  }
}

TEST(ToolCalls, RoundTripThroughTheTemplates) {
  const std::string bundled = std::string(SIEVE_SOURCE_DIR) + "/models/minimax-m3-tiny";
  const auto dir = std::filesystem::temp_directory_path() / ("sieve-tool-round-trip-" + std::to_string(::getpid()));
  text::write_byte_level_tokenizer(dir.string(), 300);
  for (const std::string mode : {"adaptive", "enabled", "disabled"}) {
    expect_round_trip(text::Tokenizer::load(bundled), mode);
    expect_round_trip(text::Tokenizer::load(dir.string()), mode);  // the built-in template
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sieve::server
