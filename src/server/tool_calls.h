// Tool-call parsers for chat completions (`sieve serve --enable-auto-tool-choice
// --tool-call-parser NAME`): the tool calls a model writes become the message's `tool_calls`, as
// vLLM's and SGLang's MiniMax parsers return them.
//
// minimax_m3 (spec section 7): the namespace token ]<]minimax[>[ (NS) before every tag; one block
// holds one or more invokes; a parameter is named by its own tag; objects are child tags, array
// elements <item> tags, a tag repeated is an array; newlines (or nothing) between tags:
//   NS<tool_call>
//   NS<invoke name="f">NS<city>Paris NS</city>NS<days>NS<item>1 NS</item>NS</days>NS</invoke>
//   NS</tool_call>
// (no spaces before NS). Values are XML text (entities such as &amp; decoded), typed by the
// request's tool schema: string, number, integer, boolean, null, object, array; a value without
// a schema (an unknown tool or parameter) is a string, or an object / array when it has child
// tags. A <tool_call> without NS is text.
//
// minimax_m2: <minimax:tool_call>, then <invoke name="f">, <parameter name="k">VALUE</parameter>
// (a JSON value where the schema says the type is not string), </invoke>, </minimax:tool_call>.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace sieve::server {

// The names --tool-call-parser accepts.
const std::vector<std::string>& tool_parser_names();

struct ParsedToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

struct ToolCallParse {
  std::string content;  // the text outside the calls (trailing blanks dropped when there are calls)
  std::vector<ParsedToolCall> calls;
};

// Parses the tool calls of a complete text with `parser` (a name of tool_parser_names()). What
// is not a well-formed call is content, never an error:
//  - a block that breaks the format (a stray or mismatched tag, text between tags, more than 64
//    levels of nesting) is content, all of it;
//  - a block cut short (no closing tag: the generation ended) gives the invokes it completed;
//    without any, it is content.
ToolCallParse parse_tool_calls(std::string_view text, const nlohmann::ordered_json& tools,
                               const std::string& parser = "minimax_m3");

// The function names of a request's tools (entries {"type": "function", "function": {...}}, or
// the function objects themselves), in order; entries without a string name are skipped.
std::vector<std::string> tool_names(const nlohmann::ordered_json& tools);

// The grammar (EBNF of guided/guided.h) of what tool_choice "required" (`several`: one call or
// more, of any of `names`) or a named function (one call) makes the output: the block exactly as
// the chat template writes it, each call's parameters in the order its schema declares them, the
// required ones present, each value of its schema's type. minimax_m3: scalars as text (integer,
// number and boolean as JSON scalars, enum as one of its values), objects as child tags, arrays
// as <item> tags, null-only parameters left out; minimax_m2: non-string values as JSON.
std::string tool_call_grammar(const std::vector<std::string>& names, const nlohmann::ordered_json& tools,
                              bool several, const std::string& parser = "minimax_m3");

// The ids of the tokenizer's special tokens that the parsers must see (the reasoning markers of
// `reasoning_parser`, the tool-call tags and namespace token of `tool_parser`; either may be
// empty): the detokenizer keeps them even with skip_special_tokens, as vLLM's parsers ask for.
std::vector<int32_t> parser_marker_ids(const text::Tokenizer& tok, const std::string& reasoning_parser,
                                       const std::string& tool_parser);

// A piece of a streamed call (OpenAI's tool_calls delta): the call's first piece carries its
// name; the pieces' arguments, concatenated, are the call's arguments as JSON text.
struct ToolCallDelta {
  int index = 0;
  bool first = false;  // the call's first piece (it carries the name)
  std::string name;
  std::string arguments;
};

// A streamed chat's content through the parser: push() returns the content that can go out now
// (it stops short of a tool-call opening). Then either
//  - take_calls() after each push: the new pieces of the calls, as vLLM and SGLang stream them:
//    a call's name once its invoke tag is complete; minimax_m3: `{"key":` when a parameter opens,
//    a string value as its text arrives, other values when they close, `}` at </invoke>;
//    minimax_m2: each parameter when it closes. at_end closes a call cut short as it stands (an
//    open string closed, a value not come null). At the end, finish_content(calls_begun())
//    returns the rest of the content. Calls already streamed stay when their block later breaks
//    the format (the rest of that block is dropped); a parameter repeated at the top level is
//    streamed twice (the full response makes it an array);
//  - or finish() at the end: the rest of the content and the calls, as parse_tool_calls gives
//    them for everything pushed.
class ToolCallStream {
 public:
  explicit ToolCallStream(const std::string& parser = "minimax_m3");
  ~ToolCallStream();
  ToolCallStream(ToolCallStream&&) noexcept;
  ToolCallStream& operator=(ToolCallStream&&) noexcept;

  std::string push(std::string_view content);
  std::vector<ToolCallDelta> take_calls(const nlohmann::ordered_json& tools, bool at_end);
  bool calls_begun() const;
  // The content not returned yet: up to the first call's block when there are calls, else all.
  std::string finish_content(bool calls);
  ToolCallParse finish(const nlohmann::ordered_json& tools);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sieve::server
